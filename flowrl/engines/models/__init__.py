"""Model folders: loading, writing, importing (GGUF), and the built-in tiny model."""
