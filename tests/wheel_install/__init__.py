"""The package as users install it: the built wheel in a fresh venv, outside the checkout."""
