"""Zero every device-code payload of a CUDA library's fat binary except one architecture's
cubins, so that it compresses small enough to carry to a lent GPU machine.

vLLM 0.33.0's ``_C_stable_libtorch.abi3.so`` (92 MB: cubins for seven architectures and PTX)
holds its C++ ``top_k_per_row_decode``, the baseline ``bench_topk.py`` and
``bench_indexer_step.py`` time the plugin against. Kept for sm_90 only it xz-compresses to
11 MB (64 MB whole), inside the device tool's 64 MiB carry. The headers stay as they were, so
the CUDA runtime registers the library as before and loads the sm_90 cubin on an H100/H200;
another GPU would find zeros where its code was and fail to load it. For benchmarks only.

    python benchmarks/trim_fatbin.py SRC DST [--arch 90]
"""

from __future__ import annotations

import argparse
import struct
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KIND_CUBIN = 2


def section(data: bytes, name: bytes) -> tuple[int, int]:
    """(file offset, size) of the ELF64 section ``name``."""
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    names = struct.unpack_from("<QQ", data, shoff + shstrndx * shentsize + 0x18)
    for i in range(shnum):
        header = shoff + i * shentsize
        (name_at,) = struct.unpack_from("<I", data, header)
        offset, size = struct.unpack_from("<QQ", data, header + 0x18)
        start = names[0] + name_at
        if data[start : data.index(b"\0", start)] == name:
            return offset, size
    raise SystemExit(f"trim_fatbin.py: no {name.decode()} section")


def trim(data: bytearray, arch: int) -> tuple[list[tuple[int, int]], int]:
    """Zero, in place, every fat-binary entry but ``arch``'s cubins; ((offset, size) of each
    cubin kept, bytes zeroed)."""
    start, size = section(data, b".nv_fatbin")
    at, kept, zeroed = start, [], 0
    while at + 16 <= start + size:
        magic, _, header, length = struct.unpack_from("<IHHQ", data, at)
        if magic != FATBIN_MAGIC:  # padding between containers
            at += 8
            continue
        entry, end = at + header, at + header + length
        if header < 16 or end > start + size:
            raise SystemExit(f"trim_fatbin.py: a malformed fat binary container at {at:#x}")
        while entry < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            (entry_arch,) = struct.unpack_from("<I", data, entry + 28)
            body = entry + entry_header
            # A header too short to hold the arch would loop forever; a payload past the
            # container would zero (or append to) what follows it.
            if entry_header < 32 or body + payload > end:
                raise SystemExit(f"trim_fatbin.py: a malformed fat binary entry at {entry:#x}")
            if (kind, entry_arch) == (KIND_CUBIN, arch):
                kept.append((body, payload))
            else:
                data[body : body + payload] = bytes(payload)
                zeroed += payload
            entry = body + payload
        at = end
    return kept, zeroed


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--arch", type=int, default=90, help="SM version kept (90: H100/H200)")
    args = parser.parse_args()
    data = bytearray(args.src.read_bytes())
    kept, zeroed = trim(data, args.arch)
    if not kept:  # the library would load, then fail at its first launch
        raise SystemExit(f"trim_fatbin.py: no sm_{args.arch} cubin in {args.src}")
    args.dst.write_bytes(data)
    kept_bytes = sum(size for _, size in kept)
    print(
        f"sm_{args.arch}: kept {len(kept)} cubins ({kept_bytes >> 20} MiB),"
        f" zeroed {zeroed >> 20} MiB"
    )


if __name__ == "__main__":
    main()
