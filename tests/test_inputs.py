"""Input expansion: files, directories, globs, @lists, duplicates, stable order."""

import os
from pathlib import Path

import pytest

from pfm_dask.config import LoadConfig, parse_size
from pfm_dask.errors import ConfigError
from pfm_dask.inputs import expand_inputs, read_polygon


def _touch(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"")
    return p


def test_directories_are_searched_recursively_in_sorted_order(tmp_path):
    b = _touch(tmp_path / "d" / "b.gsf")
    a = _touch(tmp_path / "d" / "a.gsf")
    c = _touch(tmp_path / "d" / "sub" / "c.mb121")
    _touch(tmp_path / "d" / "notes.txt")
    assert expand_inputs([tmp_path / "d"]) == [a, b, c]


def test_order_given_is_kept_and_duplicates_dropped(tmp_path):
    a = _touch(tmp_path / "a.gsf")
    b = _touch(tmp_path / "b.gsf")
    (tmp_path / "link.gsf").symlink_to(a)
    got = expand_inputs([b, a, tmp_path / "link.gsf", str(a)])
    assert got == [b, a]


def test_globs_and_list_files(tmp_path):
    a = _touch(tmp_path / "x" / "a.gsf")
    b = _touch(tmp_path / "x" / "b.gsf")
    c = _touch(tmp_path / "y" / "c.gsf")
    lst = tmp_path / "list.txt"
    lst.write_text(f"# survey\n{c}\nx/*.gsf\n")
    assert expand_inputs([f"@{lst}"]) == [c, a, b]
    assert expand_inputs([str(tmp_path / "x" / "*.gsf")]) == [a, b]


def test_missing_file_and_empty_pattern_are_errors_but_unreadable_is_kept(tmp_path):
    missing = tmp_path / "gone.gsf"
    with pytest.raises(ConfigError, match="no such file"):
        expand_inputs([missing])
    (tmp_path / "dangling.gsf").symlink_to(missing)
    with pytest.raises(ConfigError, match="symbolic link to a missing file"):
        expand_inputs([tmp_path / "dangling.gsf"])
    (tmp_path / "loop.gsf").symlink_to("loop.gsf")    # exists, unreadable: the load reports it
    assert expand_inputs([tmp_path / "loop.gsf"]) == [tmp_path / "loop.gsf"]
    with pytest.raises(ConfigError, match="matches no file"):
        expand_inputs([str(tmp_path / "*.mb121")])


def test_polygon_file(tmp_path):
    p = tmp_path / "poly.txt"
    p.write_text("# area\n30.0, -80.0\n30.1 -80.0\n30.1,-79.9\n30.0, -80.0\n")
    assert read_polygon(p) == ((30.0, -80.0), (30.1, -80.0), (30.1, -79.9))
    p.write_text("30, -80\nnonsense\n")
    with pytest.raises(ConfigError, match="line 2"):
        read_polygon(p)


def test_sizes_and_config_validation():
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("2GB") == 2 * 10**9
    assert parse_size("1000") == 1000
    with pytest.raises(ConfigError, match="cannot read size"):
        parse_size("lots")
    with pytest.raises(ConfigError, match="max-depth"):
        LoadConfig(min_depth=10, max_depth=5)
    with pytest.raises(ConfigError, match="south"):
        LoadConfig(mbr=(10, 0, 5, 1))
    assert LoadConfig().null_depth == 12001.0


def test_the_same_file_by_any_spelling_hard_links_included(tmp_path):
    a = _touch(tmp_path / "x" / "a.gsf")
    b = _touch(tmp_path / "b.gsf")
    os.link(a, tmp_path / "hard.gsf")                    # same device and inode, another name
    (tmp_path / "soft.gsf").symlink_to(a)
    got = expand_inputs([a, tmp_path / "hard.gsf", b, str(tmp_path / "x" / ".." / "soft.gsf"),
                         f"{tmp_path}//x/./a.gsf"])
    assert got == [a, b]


def test_list_files_take_trailing_comments(tmp_path):
    a = _touch(tmp_path / "a.gsf")
    b = _touch(tmp_path / "b.gsf")
    c = _touch(tmp_path / "c#2.gsf")                  # a '#' inside a name is part of it
    lst = tmp_path / "list.txt"
    lst.write_text("  # the survey\na.gsf   # day 1\nb.gsf\t# day 2, rerun\nc#2.gsf\n")
    assert expand_inputs([f"@{lst}"]) == [a, b, c]


def test_special_files_named_gsf_are_skipped_and_reported(tmp_path):
    import socket

    a = _touch(tmp_path / "d" / "a.gsf")
    os.mkfifo(tmp_path / "d" / "pipe.gsf")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "d" / "sock.gsf"))
    (tmp_path / "d" / "null.gsf").symlink_to("/dev/null")
    problems: list[str] = []
    assert expand_inputs([tmp_path / "d", tmp_path / "d" / "pipe.gsf"], problems=problems) == [a]
    sock.close()
    text = "\n".join(problems)
    assert len(problems) == 4, problems
    for name, kind in (("pipe.gsf", "a FIFO"), ("sock.gsf", "a socket"),
                       ("null.gsf", "a character device")):
        assert f"{tmp_path / 'd' / name}: {kind}, not a regular file: skipped" in text, text


def test_unreadable_folders_are_reported_and_linked_folders_followed_once(tmp_path, monkeypatch):
    a = _touch(tmp_path / "d" / "a.gsf")
    c = _touch(tmp_path / "d" / "locked" / "c.gsf")
    b = _touch(tmp_path / "elsewhere" / "b.gsf")
    (tmp_path / "d" / "more").symlink_to(tmp_path / "elsewhere")    # followed
    (tmp_path / "d" / "loop").symlink_to(tmp_path / "d")            # searched once
    real = os.scandir

    def scandir(path="."):
        if os.fspath(path).endswith("locked"):                      # root reads anything
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    problems: list[str] = []
    assert expand_inputs([tmp_path / "d"], problems=problems) == [a, tmp_path / "d" / "more" /
                                                                   "b.gsf"]
    assert problems == [f"{tmp_path / 'd' / 'locked'}: cannot read the folder (Permission "
                        "denied): the files in it were not searched"]
    assert c.exists() and b.exists()
