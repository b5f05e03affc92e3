"""``pyrt serve``'s stdout while it serves: the lines Ray's driver prints for its raylet, through Ray's own printer.

Ray's driver thread ``listen_error_messages`` hands each line the raylet pushes ("(raylet) A worker died
...", the memory monitor, a stop's "graceful_shutdown failed") to ``print_to_stdstream``, which writes it
to ``sys.stdout`` in colour. Here that function (Ray's, not a copy) prints inside
:func:`pyrt.serve.command.ray_output`, as it does while ``pyrt serve`` runs; no Ray is started.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from pyrt.serve.command import ray_output

worker = pytest.importorskip("ray._private.worker")


def _raylet_says(text: str) -> None:
    worker.print_to_stdstream({"lines": [text], "pid": "raylet", "is_err": False}, ignore_prefix=False)


def test_raylet_lines_are_dropped_unless_verbose(capfd: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    with ray_output(verbose=False):
        _raylet_says("A worker died or was killed while executing a task (quiet)")
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_with_verbose_raylet_lines_show_without_colour_on_a_stdout_that_is_no_terminal(
        capfd: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    with ray_output(verbose=True):
        _raylet_says("A worker died or was killed while executing a task (verbose)")
    out, _ = capfd.readouterr()
    assert "(raylet) A worker died" in out and "\x1b[" not in out, repr(out)
    assert "RAY_COLOR_PREFIX" not in os.environ  # put back as it was
    _raylet_says("Ray's own colours outside pyrt serve (the probe: Ray colours a line by default)")
    assert "\x1b[" in capfd.readouterr().out


def test_a_colour_setting_of_the_user_s_own_is_kept(capfd: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_COLOR_PREFIX", "1")
    with ray_output(verbose=True):
        _raylet_says("A worker died or was killed while executing a task (coloured on request)")
    assert "\x1b[" in capfd.readouterr().out and os.environ["RAY_COLOR_PREFIX"] == "1"
