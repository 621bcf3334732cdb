"""recipetune: search LLM training recipes, measure them for real, approve only on evidence."""
__version__ = "0.1.0"
