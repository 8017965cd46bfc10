"""Model artifacts: a file that is not one is named for what it is."""

from __future__ import annotations

import pytest

from confide.artifact import ModelArtifact
from confide.errors import InvalidParameterError


def test_a_vertical_model_part_is_named_for_what_it_is(tmp_path):
    part = tmp_path / "clinic.model.cvw"
    part.write_bytes(b"\x00" * 16)
    with pytest.raises(InvalidParameterError, match=r"raw part of a vertical model .* beside it, clinic.model.zip"):
        ModelArtifact.load(part)


def test_a_file_that_is_no_artifact_says_which_file_is_meant(tmp_path):
    other = tmp_path / "notes.zip"
    other.write_bytes(b"not a zip")
    with pytest.raises(InvalidParameterError, match=r"not a Confide model artifact \(BadZipFile\)"):
        ModelArtifact.load(other)
    with pytest.raises(InvalidParameterError, match="no such model file"):
        ModelArtifact.load(tmp_path / "missing.model.zip")
