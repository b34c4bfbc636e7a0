"""What a run shows: loggers, plots, profiles, and the garbage collector's heap."""
