"""The built-in tasks: arithmetic, the calculator tool task, generated word problems."""
