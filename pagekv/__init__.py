"""pagekv: stateful actors whose SQLite databases live in a key-value store."""

__version__ = "0.1.0"
