"""The launcher and the trainers' loader agree on a recipe's local data (data/sources.py):
which names are local files and which files are their data. A source the loader would refuse
is refused before launch with the loader's own line; the launcher imports no `datasets`."""

from __future__ import annotations

import pytest

from maxent_grpo.errors import ConfigError
from maxent_grpo.launch.local_data import check_local_data


def _missing(d):
    return str(d / "nope.jsonl")


def _no_data_files(d):
    (d / "notes.txt").write_text("hello\n")
    return str(d)


def _mixed_formats(d):
    (d / "a.jsonl").write_text('{"problem": "1+1", "solution": "2"}\n')
    (d / "b.csv").write_text("problem,solution\n1+1,2\n")
    return str(d)


def _empty(d):
    (d / "rows.jsonl").write_text("")
    return str(d / "rows.jsonl")


BROKEN = {
    "missing": _missing,
    "no_data_files": _no_data_files,
    "mixed_formats": _mixed_formats,
    "empty": _empty,
}
# (recipe values for a source, its key path, whether the loader gets it as a path)
PLACES = {
    "dataset_name": lambda name: ({"dataset_name": name}, "dataset_name", False),
    "mixture_path": lambda name: (
        {"dataset_mixture": {"datasets": [{"path": name}]}},
        "dataset_mixture.datasets[0]",
        True,
    ),
    # an `id` that names local files is local for the loader too (source_kind)
    "mixture_id": lambda name: (
        {"dataset_mixture": {"datasets": [{"id": name}]}},
        "dataset_mixture.datasets[0]",
        False,
    ),
}


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("case", BROKEN)
def test_the_launcher_refuses_what_the_loader_refuses_with_its_line(tmp_path, case, place):
    from maxent_grpo.data.errors import DataError
    from maxent_grpo.data.load import load_source  # imports datasets: the trainers' side

    name = BROKEN[case](tmp_path)
    values, where, is_path = PLACES[place](name)
    with pytest.raises(DataError) as loader:
        load_source(name, is_path=is_path, num_rows=4, seed=0, where=where)
    with pytest.raises(ConfigError) as launcher:
        check_local_data(values)
    assert str(launcher.value) == str(loader.value)
    assert str(launcher.value).startswith(f"{where}: ") and name in str(launcher.value)


def test_a_good_directory_is_checked_by_its_first_file(tmp_path):
    (tmp_path / "b.jsonl").write_text('{"question": "1+1", "solution": "2"}\n')
    (tmp_path / "a.jsonl").write_text('{"problem": "1+1", "solution": "2"}\n')
    values = {"dataset_name": str(tmp_path), "dataset_prompt_column": "problem"}
    check_local_data(values)  # a.jsonl, the first in the loader's order, has the column
    values["dataset_prompt_column"] = "question"
    with pytest.raises(ConfigError, match="column 'question' not in"):
        check_local_data(values)
