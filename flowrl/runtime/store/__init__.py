"""The run folder: checkpoints, resume, the lock, signatures, export, dumps."""
