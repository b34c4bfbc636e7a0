"""Scoring rows: rule scorers, the worker pool, HTTP reward servers, evaluation metrics."""
