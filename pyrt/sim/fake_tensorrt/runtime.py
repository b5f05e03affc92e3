"""The fake ``trt.Runtime``: deserializes reference engines from a buffer or through an
``IStreamReaderV2`` (pulled as TensorRT-RTX pulls a plan), refusing anything else as TensorRT does.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import tempfile
from typing import Any

import numpy as np

from pyrt.errors import PyrtError
from pyrt.sim.fake_tensorrt.bindings import (
    IO_DTYPES,
    ILogger,
    IStreamReaderV2,
    SeekPosition,
    call_override,
    log_message,
)
from pyrt.sim.fake_tensorrt.engine import FakeCudaEngine
from pyrt.sim.fake_tensorrt.failures import FailureInjection
from pyrt.sim.refengine import ALIGN, HEADER, MAGIC, RefEngine

_PLAN_MAGICS = (b"ptrt", b"ftrt", b"vtrt", b"ntrt")  # first bytes of serialized TensorRT plans


class FakeRuntime:
    """``trt.Runtime``: deserializes reference engines onto the current device."""

    def __init__(self, trt: FailureInjection, logger: ILogger) -> None:
        self._trt = trt
        self.logger = logger
        self.stream_requests: list[int] = []  # byte counts the runtime asked a stream reader for
        self.stream_reads: list[tuple[int, int]] = []  # (num_bytes asked, bytes taken) per read() call

    def _read_stream(self, reader: IStreamReaderV2) -> mmap.mmap | bytes | None:
        """Pull a reference engine through ``reader`` the way TensorRT-RTX 1.7 pulls a plan.

        Seen on an H100 (docs/hardware.md): rewind with seek(0, SET), then exact-size requests
        for the parts of the plan (its 64-byte header, then 48 bytes of metadata, ...). Here the
        parts are the reference engine's header, its JSON (padded), then its weights region.
        TensorRT's copy goes to a spool file (its "device"), mapped read-only: the fake holds no
        host copy of a streamed engine, as TensorRT holds none of streamed weights.
        """
        if not call_override(reader, "seek", 0, SeekPosition.SET):
            self._error("IRuntime::deserializeCudaEngineV2: IStreamReaderV2 seek(0, SET) failed")
            return None
        with tempfile.TemporaryFile(prefix="pyrt-fake-engine-") as spool:
            head = self._request(reader, HEADER.size, "header", spool)
            if head is None:
                return None
            spool.seek(0)
            data = spool.read(HEADER.size)
            if data[:8] != MAGIC:
                return data  # refused by the caller, with what the bytes look like
            json_len = HEADER.unpack_from(data)[3]
            meta_len = _align(HEADER.size + json_len) - HEADER.size
            if self._request(reader, meta_len, "metadata", spool) is None:
                return None
            spool.seek(HEADER.size)
            meta = spool.read(json_len)
            try:
                weights = json.loads(meta)["weights"]
                size = max((_align(int(w["offset"]) + int(w["nbytes"])) for w in weights), default=0)
            except (ValueError, TypeError, KeyError) as exc:
                self._error(f"IRuntime::deserializeCudaEngineV2: bad reference-engine metadata: {exc!r}")
                return None
            spool.seek(HEADER.size + meta_len)
            if size and self._request(reader, size, "weights", spool) is None:
                return None
            spool.truncate(HEADER.size + meta_len + size)  # a trailing hole still counts
            return mmap.mmap(spool.fileno(), 0, access=mmap.ACCESS_READ)

    def _request(self, reader: IStreamReaderV2, nbytes: int, what: str, spool: Any) -> int | None:
        """One request of ``nbytes``, through the binding's trampoline (PyStreamReaderV2::read), into ``spool``.

        The trampoline calls ``read(remaining, stream)`` until ``nbytes`` arrive, takes at most
        ``remaining`` bytes of any buffer, stops at an empty one ("User aborted the operation"),
        and turns an exception or a non-buffer into 0 bytes for the whole request (printed to
        stderr). The runtime then logs how much it got. Runs of zeros become holes in the spool.
        """
        self.stream_requests.append(nbytes)
        got_total = 0
        while got_total < nbytes:
            want = nbytes - got_total
            got = call_override(reader, "read", want, 0)
            try:
                view = memoryview(got).cast("B")  # any C-contiguous buffer (the fake refuses strided ones)
            except TypeError as exc:
                print(f"[ERROR] Exception caught in read(): Object of type '{type(got).__name__}' is not an "
                      f"instance of 'buffer' ({exc})", file=sys.stderr)
                got_total = 0
                break
            take = min(view.nbytes, want)
            self.stream_reads.append((want, take))
            if take == 0:
                print("[ERROR] User aborted the operation, the read function in streamReaderV2 returned 0 bytes.",
                      file=sys.stderr)
                break
            piece = view[:take]
            if not np.frombuffer(piece, dtype=np.uint8).any():
                spool.seek(take, os.SEEK_CUR)  # zeros: a hole, as the device memory is zeroed
            else:
                spool.write(piece)
            got_total += take
        end = spool.tell()
        if os.fstat(spool.fileno()).st_size < end:
            spool.truncate(end)  # a trailing hole is still part of the file
        if got_total != nbytes:
            self._error(f"IRuntime::deserializeCudaEngineV2: Error Code 4: API Usage Error (Failed to read {what} "
                        f"from the stream: read {got_total} out of {nbytes} bytes)")
            return None
        return got_total

    def _error(self, msg: str) -> None:
        log_message(self.logger, ILogger.Severity.ERROR, msg)

    def deserialize_cuda_engine(self, serialized_engine: Any) -> FakeCudaEngine | None:
        """Engine from a buffer or an ``IStreamReaderV2`` holding a reference engine, or None (logged).

        Anything else raises TypeError, as the binding's overload resolution does.
        """
        streamed = isinstance(serialized_engine, IStreamReaderV2)
        if streamed:
            serialized_engine = self._read_stream(serialized_engine)
            if serialized_engine is None:
                return None
        try:
            view = memoryview(serialized_engine).cast("B")
        except TypeError:
            raise TypeError(f"deserialize_cuda_engine(): incompatible function arguments: "
                            f"{type(serialized_engine).__name__} is neither a buffer nor an IStreamReaderV2") from None
        if self._trt._fails("deserialize_cuda_engine"):
            self._error("IRuntime::deserializeCudaEngine: injected failure")
            return None
        head = bytes(view[:8])
        if head != MAGIC:
            kind = "a serialized TensorRT engine" if head[:4] in _PLAN_MAGICS else "not an engine"
            self._error(
                f"IRuntime::deserializeCudaEngine: the fake TensorRT runtime deserializes only pyrt "
                f"reference engines ({MAGIC.decode()}); these {view.nbytes} bytes start with {head!r} "
                f"({kind}); real engines need a real GPU and TensorRT (for a machine without one, export with "
                f"--builder portable or --builder reference)"
            )
            return None
        device = self._trt.driver.current_device()
        if device is None:
            self._error("IRuntime::deserializeCudaEngine: no current CUDA context")
            return None
        try:
            # TensorRT keeps its own copy: a streamed engine's is the spool already, a buffer's is copied
            ref = RefEngine.from_bytes(view if streamed else bytes(view), source="serialized engine")
        except PyrtError as exc:
            self._error(f"IRuntime::deserializeCudaEngine: {exc}")
            return None
        for t in [*ref.inputs, *ref.outputs]:
            if t.dtype not in IO_DTYPES:
                self._error(f"IRuntime::deserializeCudaEngine: I/O tensor {t.name!r} has dtype "
                            f"{t.dtype}, which TensorRT cannot bind")
                return None
        engine = FakeCudaEngine(self._trt, ref, device, self.logger)
        if not ref.weight_streaming and not engine._hold("weights", sum(w.nbytes for w in ref.weights.values())):
            return None
        return engine


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
