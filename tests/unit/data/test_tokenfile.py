"""Token files (hpctrain.data.tokenfile): the header beside the ids, its versions, and headers that would
pass a loose check refused in one line before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hpctrain.data.catalog import read_token_header
from hpctrain.data.tokenfile import read_header, read_token_file, write_token_file
from hpctrain.data.tokenizer import ByteTokenizer, tokenizer_for
from tests.support import refused


def test_token_file_round_trip(tmp_path: Path) -> None:
    tokens = np.array([0, 5, 65535, 7, 1], dtype=np.int64)
    header = write_token_file(tmp_path / "t.bin", tokens, vocab_size=65536)
    assert header == {
        "format": "hpctrain-tokens",
        "version": 2,
        "dtype": "uint16",
        "vocab_size": 65536,
        "num_tokens": 5,
        "tokenizer": None,
    }
    assert (tmp_path / "t.bin").stat().st_size == 10
    mm, hdr = read_token_file(tmp_path / "t.bin")
    assert hdr == header and mm.tolist() == tokens.tolist()
    assert not mm.flags.writeable
    big = write_token_file(tmp_path / "u.bin", np.array([70000, 1]), vocab_size=70001)
    assert big["dtype"] == "uint32" and read_token_file(tmp_path / "u.bin")[0].tolist() == [70000, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.bin", "t.json", "u.bin", "u.json"]  # no temps
    with pytest.raises(ValueError, match="vocab_size=10"):
        write_token_file(tmp_path / "v.bin", np.array([3, 12]), vocab_size=10)


def test_token_file_size_mismatch(tmp_path: Path) -> None:
    write_token_file(tmp_path / "t.bin", np.arange(10), vocab_size=10)
    with open(tmp_path / "t.bin", "ab") as f:
        f.write(b"\x00")
    with pytest.raises(ValueError, match=r"21 bytes.*num_tokens=10 × 2 bytes \(uint16\) = 20 bytes"):
        read_header(tmp_path / "t.bin")
    (tmp_path / "t.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not an hpctrain-tokens header"):
        read_header(tmp_path / "t.bin")


def test_header_versions(tmp_path: Path) -> None:
    write_token_file(tmp_path / "t.bin", np.arange(4), vocab_size=256)
    header = json.loads((tmp_path / "t.json").read_text())
    (tmp_path / "t.json").write_text(
        json.dumps({k: v for k, v in header.items() if k != "tokenizer"} | {"version": 1})
    )
    assert read_token_file(tmp_path / "t.bin")[0].tolist() == [0, 1, 2, 3]  # version 1 still reads
    assert isinstance(tokenizer_for(tmp_path / "t.bin"), ByteTokenizer)  # what version 1 wrote from text
    v1 = json.loads((tmp_path / "t.json").read_text())
    (tmp_path / "t.json").write_text(json.dumps(v1 | {"vocab_size": 1000}))
    with pytest.raises(ValueError, match=r"version 1\) records no tokenizer"):
        tokenizer_for(tmp_path / "t.bin")
    (tmp_path / "t.json").write_text(json.dumps(header | {"version": 7}))
    for read in (read_token_header, tokenizer_for):
        with pytest.raises(ValueError, match=r"has version 7; valid: 1 or 2") as err:
            read(tmp_path / "t.bin")
        assert "\n" not in str(err.value)


# --- token files whose header would pass a loose check and fail (or mislead) inside the workers.
TOKEN_HEADERS = {
    "a list": "[1, 2]",
    "a null vocabulary": '{"format": "hpctrain-tokens", "version": 1, "dtype": "uint16", "vocab_size": null, '
    '"num_tokens": 4}',
    "a dtype that does not match the file size": '{"format": "hpctrain-tokens", "version": 1, '
    '"dtype": "uint32", "vocab_size": 256, "num_tokens": 4}',
    "another version": '{"format": "hpctrain-tokens", "version": 9, "dtype": "uint16", "vocab_size": 256, '
    '"num_tokens": 4}',
}


@pytest.mark.parametrize("case", list(TOKEN_HEADERS))
def test_a_token_file_with_a_bad_header_is_refused_in_one_line(cli, tmp_path: Path, case: str):  # type: ignore[no-untyped-def]
    data = tmp_path / "corpus.bin"
    data.write_bytes(bytes(8))  # 4 uint16 tokens
    (tmp_path / "corpus.json").write_text(TOKEN_HEADERS[case])
    run = tmp_path / "run"
    result = cli("data=tokens", f"data.path={data}", f"hydra.run.dir={run}")
    refused(result, ["data.path=", "corpus"])
    assert not run.exists()
