"""Dataset loaders on the real public data (the slices shipped in recipes/data, and the
full files in ../shared/data, skipped when it is absent) and on broken files made here."""

import gzip
import json
from pathlib import Path

import pytest

from runtime.data.datasets import DatasetError, load_records
from tests.helpers import DATA_SLICES as SLICES
from tests.helpers import SHARED_DATA as DATA
from tests.helpers import needs_full_data


def full(path, *values):  # a case on a file of ../shared/data that is not sliced
    return pytest.param(path, *values, marks=needs_full_data(str(path.relative_to(DATA))))


@pytest.mark.parametrize(
    ("path", "fields", "required", "count"),
    [
        (SLICES / "gsm8k/test.jsonl", {"prompt": "question"}, ("prompt", "answer"), 300),
        full(DATA / "math500/test.jsonl", {"prompt": "problem"}, ("prompt", "answer"), 500),
        full(DATA / "aime/aime2024.json", {"prompt": "problem"}, ("prompt", "answer"), 30),
        full(DATA / "amc/amc.json", {"prompt": "problem"}, ("prompt", "answer"), 83),
        (SLICES / "humaneval/HumanEval.jsonl.gz", {"tests": "test"}, ("prompt", "tests"), 164),
        (
            SLICES / "mbpp/mbpp.jsonl",
            {"prompt": "text", "tests": "test_list"},
            ("prompt", "tests"),
            300,
        ),
    ],
    ids=["gsm8k", "math500", "aime", "amc", "humaneval", "mbpp"],
)
def test_real_datasets_load_with_their_field_mapping(path, fields, required, count):
    records = load_records(path, fields=fields, required=required)
    assert len(records) == count
    for role, source in fields.items():
        assert all(r[role] == r[source] for r in records)
    assert all(r["prompt"] for r in records)


def test_parquet_gives_the_same_records_as_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = load_records(SLICES / "gsm8k/test.jsonl")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "gsm8k.parquet")
    back = load_records(tmp_path / "gsm8k.parquet", fields={"prompt": "question"})
    assert [r["question"] for r in back] == [r["question"] for r in rows]
    assert back[0]["prompt"] == rows[0]["question"]


def write(tmp_path, name, text, gz=False):
    path = tmp_path / name
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("name", "text", "kwargs", "message"),
    [
        ("missing.jsonl", None, {}, "missing.jsonl: no such dataset file"),
        (
            "a.jsonl",
            '{"q": "1+1", "a": 2}\n{"q": "2+2"}\n',
            {"fields": {"prompt": "q", "answer": "a"}},
            "a.jsonl: record 1 has no field 'a' (data.fields.answer); it has: q",
        ),
        (
            "b.jsonl",
            '{"prompt": "x"}\n',
            {"required": ("prompt", "tests")},
            "b.jsonl: record 0 has no field 'tests'; it has: prompt",
        ),
        ("c.jsonl", '{"prompt": "x"}\n{oops\n', {}, "c.jsonl:2: not valid JSON"),
        ("d.json", '{"prompt": "x"}', {}, "d.json: expected a JSON list of records, got dict"),
        ("e.csv", "prompt\nx\n", {}, "e.csv: cannot tell the format from the name"),
        ("f.jsonl", "\n\n", {}, "f.jsonl: no records"),
        ("g.jsonl", "[1, 2]\n", {}, "g.jsonl:1: a record must be a JSON object"),
    ],
)
def test_bad_files_get_one_line_naming_file_record_and_field(tmp_path, name, text, kwargs, message):
    path = tmp_path / name if text is None else write(tmp_path, name, text)
    with pytest.raises(DatasetError) as err:
        load_records(path, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_gzipped_json_list(tmp_path):
    path = write(tmp_path, "h.json.gz", json.dumps([{"prompt": "p", "answer": "1"}]), gz=True)
    assert load_records(path, required=("prompt", "answer"))[0]["answer"] == "1"


def test_verl_parquet_schema_nested_answer_and_chat_prompt(tmp_path):
    """DAPO-Math-17K as verl ships it: prompt = chat messages, answer under reward_model."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from runtime.data.datasets import check_template, prompt_text

    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": f"Solve {i} + 1."}],
            "reward_model": {"ground_truth": str(i + 1), "style": "rule"},
        }
        for i in range(3)
    ]
    path = tmp_path / "dapo.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    fields = {"prompt": "prompt", "answer": "reward_model.ground_truth"}
    records = load_records(path, fields=fields, required=("prompt", "answer"))
    assert [r["answer"] for r in records] == ["1", "2", "3"]
    assert prompt_text(records[2], "{prompt} Box it.") == "Solve 2 + 1. Box it."
    check_template("{prompt}", records[0], path)
    with pytest.raises(
        DatasetError, match=r"no field 'reward_model.answer' \(data.fields.answer\)"
    ):
        load_records(path, fields={"answer": "reward_model.answer"}, required=("answer",))


@pytest.mark.parametrize(
    "template, message",
    [
        ("{prompt} {hint}", "uses {hint}, which records lack"),
        ("{tests[5]}", "cannot be filled"),
        ("{prompt", "cannot be filled"),
    ],
)
def test_bad_prompt_template_is_one_line(tmp_path, template, message):
    from runtime.data.datasets import check_template

    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "p", "tests": ["a"]}) + "\n")
    record = load_records(path)[0]
    with pytest.raises(DatasetError, match=message) as info:
        check_template(template, record, path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_a_folder_written_by_datasets_save_to_disk_is_read_split_by_split():
    """tests/fixtures/hf_toy_add: a DatasetDict (train 4 rows, test 2) written by Hugging
    Face datasets 5.2.0's save_to_disk; read with pyarrow alone."""
    rows = load_records(
        FIXTURES / "hf_toy_add" / "train", fields={"prompt": "question"}, required=("answer",)
    )
    assert [r["answer"] for r in rows] == ["3", "7", "15", "14"]
    assert rows[0]["prompt"] == "What is 1 + 2?" and rows[0]["extra_info"] == {"index": 0}
    assert len(load_records(FIXTURES / "hf_toy_add" / "test")) == 2
    with pytest.raises(DatasetError) as e:
        load_records(FIXTURES / "hf_toy_add")
    assert str(e.value) == (
        f"{FIXTURES / 'hf_toy_add'}: a DatasetDict folder: name one split, e.g. "
        f"{FIXTURES / 'hf_toy_add' / 'train'} (splits: train, test)"
    )


def test_a_folder_of_parquet_shards_is_read_in_shard_order():
    rows = load_records(FIXTURES / "parquet_toy_add", required=("question", "answer"))
    assert [r["answer"] for r in rows] == ["3", "7", "15", "14", "11", "7"]


def test_folders_that_hold_no_dataset_get_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DatasetError, match="neither one written by datasets' save_to_disk"):
        load_records(tmp_path)
    (tmp_path / "state.json").write_text("{}")
    with pytest.raises(DatasetError, match=r"state\.json: not a datasets\.save_to_disk state"):
        load_records(tmp_path)
    with pytest.raises(DatasetError, match="no such dataset file or folder"):
        load_records(tmp_path / "missing")
    with pytest.raises(DatasetError, match=r"data\.format jsonl does not read a folder"):
        load_records(FIXTURES / "parquet_toy_add", fmt="jsonl")
