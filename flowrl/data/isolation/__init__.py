"""The OS sandbox of model-written code: bubblewrap, seccomp, the python tool's runner."""
