"""Frame codecs on real rendered frames: bytes and read speed of each candidate for the step table.

Renders gymnasium CartPole-v1 (and LunarLander-v3 when box2d is installed) as ``rgb_array``,
resized to 84x84x3 ``uint8``, and stores the same frames three ways: raw bytes in a Parquet
binary column compressed by the column's zstd (what rlpipe writes), zstd per frame, and PNG per
frame (Pillow, lossless). Prints one JSON line per env.

    python bench/frame_codecs.py [--frames 2000]
"""

from __future__ import annotations

import argparse
import io
import json
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

SIZE = (84, 84)


def frames(env_id: str, n: int) -> np.ndarray:
    env = gym.make(env_id, render_mode="rgb_array")
    env.reset(seed=0)
    out = []
    while len(out) < n:
        image = Image.fromarray(env.render()).resize(SIZE, Image.Resampling.BILINEAR)
        out.append(np.asarray(image))
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    env.close()
    return np.stack(out)


def parquet_bytes(values: list[bytes]) -> tuple[int, float]:
    table = pa.table({"observation": pa.array(values, pa.binary())})
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", use_dictionary=False, write_statistics=False)
    data = sink.getvalue()
    start = time.perf_counter()
    column = pq.read_table(io.BytesIO(data)).column(0).combine_chunks()
    np.frombuffer(column.buffers()[2], np.uint8)  # the frames, one buffer
    return len(data), time.perf_counter() - start


def measure(env_id: str, n: int) -> dict[str, Any]:
    batch = frames(env_id, n)
    raw = [frame.tobytes() for frame in batch]
    codec = pa.Codec("zstd")
    results: dict[str, Any] = {"env": env_id, "frames": n, "frame_bytes": len(raw[0])}
    size, read_s = parquet_bytes(raw)
    results["parquet_zstd"] = {"bytes_per_frame": size / n, "read_us_per_frame": read_s / n * 1e6}
    start = time.perf_counter()
    packed = [codec.compress(frame, asbytes=True) for frame in raw]
    write_s = time.perf_counter() - start
    size, _ = parquet_bytes(packed)
    start = time.perf_counter()
    for item in packed:
        codec.decompress(item, decompressed_size=len(raw[0]), asbytes=True)
    read_s = time.perf_counter() - start
    results["zstd_per_frame"] = {
        "bytes_per_frame": size / n,
        "write_us_per_frame": write_s / n * 1e6,
        "read_us_per_frame": read_s / n * 1e6,
    }
    start = time.perf_counter()
    pngs = []
    for frame in batch:
        sink = io.BytesIO()
        Image.fromarray(frame).save(sink, format="PNG", optimize=False)
        pngs.append(sink.getvalue())
    write_s = time.perf_counter() - start
    size, _ = parquet_bytes(pngs)
    start = time.perf_counter()
    for item in pngs:
        np.asarray(Image.open(io.BytesIO(item)))
    read_s = time.perf_counter() - start
    results["png_per_frame"] = {
        "bytes_per_frame": size / n,
        "write_us_per_frame": write_s / n * 1e6,
        "read_us_per_frame": read_s / n * 1e6,
    }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=2000)
    args = parser.parse_args()
    envs = ["CartPole-v1"]
    try:
        import Box2D  # noqa: F401

        envs.append("LunarLander-v3")
    except ImportError:
        print(json.dumps({"env": "LunarLander-v3", "skipped": "box2d is not installed"}))
    for env_id in envs:
        print(json.dumps(measure(env_id, args.frames)), flush=True)


if __name__ == "__main__":
    main()
