"""Read the history of an offline W&B run straight from its ``run-*.wandb`` file (wandb ≥ 0.19 dropped its
Python reader). The file is a 7-byte header (``:W&B``, magic, version) followed by LevelDB log records —
32 KiB blocks of ``<crc32:4><length:2><type:1><payload>`` chunks (1 full, 2 first, 3 middle, 4 last) — whose
payloads are ``wandb_internal_pb2.Record`` protobufs."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

BLOCK = 32768
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending = 7, b""
    while pos + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < CHUNK_HEADER:  # the writer pads the end of a block with zeros
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        payload = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == FULL:
            yield payload
        elif kind == FIRST:
            pending = payload
        elif kind == MIDDLE:
            pending += payload
        elif kind == LAST:
            yield pending + payload
        else:  # zero padding within a block, or the unwritten tail of a file cut short
            break


def history(run_dir: Path) -> tuple[set[str], list[int]]:
    """(run ids, the ``_step`` of every history row) over every offline segment of a run directory."""
    from wandb.proto import wandb_internal_pb2

    run_ids: set[str] = set()
    steps: list[int] = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for payload in records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_ids.add(record.run.run_id)
            elif kind == "history":
                for item in record.history.item:
                    if item.key == "_step" or list(item.nested_key) == ["_step"]:
                        steps.append(int(json.loads(item.value_json)))
    return run_ids, steps
