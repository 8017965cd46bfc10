"""The ``confide`` command (argument parsing and printing only; the work lives elsewhere)."""

from confide.cli.main import main

__all__ = ["main"]
