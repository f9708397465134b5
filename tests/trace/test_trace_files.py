"""What is wrong with a trace file as a file, named as its real cause in one line and a non-zero
exit: a gzip cut short (with the bytes that do inflate, counted here apart from graphrt by zlib),
an empty file, an empty gzip, a symbolic link loop or one to nothing."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from click.testing import CliRunner

from graphrt.cli.main import main

A100 = Path(__file__).parents[1] / "data" / "torch" / "hta-a100-alexnet-eager.json.gz"


def _refusal(*paths: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["analyze", *map(str, paths)])
    return result.exit_code, result.output.strip()


def _inflatable(packed: bytes) -> int:
    """The bytes of JSON a gzip cut short still inflates to."""
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
    return len(inflater.decompress(packed)) + len(inflater.flush())


def test_a_gzip_cut_in_half_is_a_truncated_stream_after_every_byte_that_inflates(tmp_path):
    packed = A100.read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(packed[:len(packed) // 2])
    inflated = _inflatable(cut.read_bytes())
    assert 0 < inflated < len(gzip.decompress(packed))
    code, said = _refusal(cut)
    assert code == 1 and said == (f"error: {cut}: a truncated gzip stream: it ends after {inflated:,} inflated bytes "
                                  "of JSON, before its end-of-stream marker (a copy cut short?)")


def test_a_gzip_cut_past_its_first_mebibyte_counts_every_chunk_it_inflated(tmp_path):
    big = gzip.compress(gzip.decompress(A100.read_bytes()) * 8)  # 2.5 MB of JSON: several chunks of inflation
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(big[:len(big) - 100])
    inflated = _inflatable(cut.read_bytes())
    assert inflated > 2 << 20
    assert f"it ends after {inflated:,} inflated bytes" in _refusal(cut)[1]


def test_an_empty_file_and_an_empty_gzip_are_named_empty(tmp_path):
    empty, nothing = tmp_path / "empty.json.gz", tmp_path / "nothing.json.gz"
    empty.write_bytes(b"")
    nothing.write_bytes(gzip.compress(b""))
    assert _refusal(empty) == (1, f"error: {empty}: an empty file (0 bytes): no trace in it")
    assert _refusal(nothing) == (1, f"error: {nothing}: an empty gzip: it inflates to 0 bytes, no trace in it")


def test_a_symbolic_link_loop_and_a_link_to_nothing_are_named_as_links(tmp_path):
    one, two, dangling = tmp_path / "one.json", tmp_path / "two.json", tmp_path / "dangling.json"
    one.symlink_to(two)
    two.symlink_to(one)
    dangling.symlink_to(tmp_path / "gone.json")
    assert _refusal(one) == (1, f"error: {one}: a symbolic link loop (it never reaches a file)")
    assert _refusal(dangling) == (1, f"error: {dangling}: a symbolic link to {tmp_path / 'gone.json'}, which does not exist")
    assert _refusal(tmp_path / "absent.json") == (1, f"error: {tmp_path / 'absent.json'}: no such file")
