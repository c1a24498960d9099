"""Video files to frames without trusting the file: a header probe, then decoding of the sampled frames only.

A container header is the attacker's to write: an 8 KB AVI can declare 2**31 - 1 frames, which makes decord
abort the whole process (`std::bad_alloc`, SIGABRT, not catchable from Python). So every file is first probed
with PyAV, which only reads the header, and `mmreward.media.read_video` checks what it declares (frame count,
duration, frame size) against limits before any decoder allocates per frame.

Decoding keeps only the sampled frames: PyAV decodes the stream in order and converts just the wanted
indices (the others are dropped as they come, so memory is the kept frames, whatever the clip's length);
decord reads them with one `get_batch`.

Rotation: phones store portrait clips as landscape pixels plus a display matrix. PyAV exposes its rotation
per frame (`VideoFrame.rotation`, degrees counter-clockwise), and frames are turned upright here as FFmpeg's
command-line tool does with autorotate (fftools: transpose for +-90, hflip+vflip for 180). Only multiples of
90 degrees are applied (the nearest one); mirroring in the matrix is ignored. decord 0.6 tries to rotate such
clips itself and fails (a size check error for 90, 180 and 270 degrees), so a rotated clip is never handed
to decord: "auto" decodes it with PyAV.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmreward.errors import MediaError

IndicesFn = Callable[[int, "float | None"], list[int]]


class LimitExceeded(MediaError):
    """A clip above a size limit: refused whatever the decoder, so "auto" does not try the next one."""


@dataclass(frozen=True)
class VideoHeader:
    """What a container declares about its first video stream, read without decoding a frame."""

    frames: int | None  # declared frame count; None when the container does not store one (webm, gif)
    rate: float | None  # average frame rate
    seconds: float | None  # declared duration of the stream (or of the container)
    width: int
    height: int


def probe(path: Path) -> VideoHeader:
    """Read the header of a video file with PyAV (FFmpeg's demuxer only: nothing is decoded)."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise MediaError(f"{path}: the file holds no video stream")
            stream = container.streams.video[0]
            rate = float(stream.average_rate) if stream.average_rate else None
            seconds = None
            if stream.duration and stream.time_base:
                seconds = float(stream.duration * stream.time_base)
            elif container.duration:
                seconds = container.duration / 1_000_000  # AV_TIME_BASE
            ctx = stream.codec_context
            return VideoHeader(int(stream.frames) or None, rate, seconds, int(ctx.width or 0), int(ctx.height or 0))
    except MediaError:
        raise
    except Exception as exc:  # noqa: BLE001 - FFmpeg's errors come as many types
        raise MediaError(f"cannot decode video {path} with av: {exc}") from exc


def first_frame_rotation(path: Path) -> int:
    """The display-matrix rotation of the first frame (degrees counter-clockwise), decoding that frame only."""
    import av

    with av.open(str(path)) as container:
        for frame in container.decode(container.streams.video[0]):
            return int(getattr(frame, "rotation", 0) or 0)
    return 0


def upright(frame: np.ndarray, rotation: float) -> np.ndarray:
    """Turn an (H, W, C) frame by its display rotation (counter-clockwise degrees, as `VideoFrame.rotation`)."""
    quarter_turns = int(round(rotation / 90)) % 4
    return np.ascontiguousarray(np.rot90(frame, quarter_turns)) if quarter_turns else frame


def count_packets(path: Path, max_frames: int | None) -> int:
    """Count the video packets of a container that stores no frame count, stopping past `max_frames`."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        total = 0
        for pkt in container.demux(stream):
            if pkt.size:
                total += 1
                if max_frames is not None and total > max_frames:
                    break
    return total


def decode_av(path: Path, total: int, rate: float | None, indices_fn: IndicesFn) -> np.ndarray:
    """The sampled frames, upright, as (T, H, W, 3) uint8; `total` is the (checked) frame count."""
    import av

    wanted = indices_fn(total, rate)
    keep = set(wanted)
    last = max(wanted)
    frames: dict[int, np.ndarray] = {}
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for i, frame in enumerate(container.decode(stream)):
            if i in keep:  # the others are dropped as they come: memory is the kept frames only
                frames[i] = upright(frame.to_ndarray(format="rgb24"), getattr(frame, "rotation", 0) or 0)
            if i >= last:
                break
    missing = [i for i in wanted if i not in frames]
    if missing:
        raise MediaError(f"cannot decode frames {missing[:5]} of {path}: the file is truncated or corrupt")
    return np.stack([frames[i] for i in wanted])


def decode_decord(path: Path, header: VideoHeader, max_frames: int | None, indices_fn: IndicesFn) -> np.ndarray:
    """The sampled frames as (T, H, W, 3) uint8 with one decord `get_batch`."""
    import decord

    if first_frame_rotation(path):
        raise MediaError(
            f"{path}: the clip has rotation metadata, which decord 0.6 cannot decode; use backend='av' "
            "(backend='auto' does)"
        )
    vr = decord.VideoReader(str(path), ctx=decord.cpu(0))
    total = len(vr)
    if max_frames is not None and total > max_frames:  # decord's own count, after the header check
        raise LimitExceeded(f"{path}: decord counts {total} frames, above max_video_frames={max_frames}")
    rate = float(vr.get_avg_fps()) or header.rate
    return vr.get_batch(indices_fn(total, rate)).asnumpy()
