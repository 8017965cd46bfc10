"""The party process: holds the data and the keys, trains locally, protects its updates."""

from confide.party.runner import load_party_data, run_party

__all__ = ["load_party_data", "run_party"]
