"""`mmreward` command line: list, score, compare.

Scoring streams: media are read, scored and written a batch at a time, so a folder of any size runs
in constant memory. A corrupt or unreadable item is written with its error and the run goes on; the
exit status is 1 when any item failed. A usage or configuration error (a missing file, a malformed
manifest row, a bad option or device, prompts that do not match the media) is one line on stderr and
exit status 2, found before anything is scored. Started under `accelerate launch` / torchrun, each process
scores every WORLD_SIZE-th item and rank 0 merges one output in input order.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from mmreward.errors import ConfigError, MMRewardError

EXIT_OK, EXIT_ITEM_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_REWARD = "jpeg-compressibility"


# ----------------------------------------------------------------------------------------------
# one line and exit 2 for every usage error (shared with the vlm-rm CLI)
# ----------------------------------------------------------------------------------------------
class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse prints the whole usage block before its error; we print the error and where to look."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(message: object) -> str:
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def run_main(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, dispatch, prog: str
) -> int:
    """Parse and dispatch; the one place where typed errors become one stderr line and exit status 2."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error already printed (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    from mmreward.output_paths import is_write_error, output_error

    try:
        try:
            return dispatch(args)
        except OSError as exc:  # a full disk or a read-only mount wherever a command writes: one line, not a traceback
            if not is_write_error(exc, disk_only=True):
                raise
            raise output_error(exc, "output") from None
    except MMRewardError as exc:
        command = getattr(args, "command", None)
        print(f"{prog}{' ' + command if command else ''}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE


# ----------------------------------------------------------------------------------------------
# parser
# ----------------------------------------------------------------------------------------------
def _add_model_args(p: argparse.ArgumentParser, default_reward: str | None = DEFAULT_REWARD) -> None:
    p.add_argument("--reward", default=default_reward, help=f"registered name or source (default: {default_reward})")
    p.add_argument("--checkpoint", help="local file/folder or hub id of the weights (default: the reward's own)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="fp32 (default), bf16 or fp16")
    p.add_argument("--weights", default="pretrained", choices=["pretrained", "random"])
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="extra loader option (JSON value)")
    p.add_argument("--batch-size", type=int, default=16, help="items scored per forward (default 16)")
    p.add_argument("--max-image-pixels", type=int, default=None, metavar="N",
                   help="image files above N pixels fail as items, before decoding (default 8192x8192)")
    p.add_argument("--out", help="output file: .jsonl or .csv (default: JSON lines on stdout)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="mmreward", description="Score images and videos with reward models")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")

    p_list = sub.add_parser("list", help="list registered rewards")
    p_list.add_argument("--json", action="store_true", help="machine-readable output")

    p_score = sub.add_parser("score", help="score media files or folders")
    _add_model_args(p_score)
    g = p_score.add_mutually_exclusive_group()
    g.add_argument("--prompt", help="one prompt for every item")
    g.add_argument(
        "--prompts",
        help="a .txt file (one prompt per line, in media order) or a .jsonl manifest of {prompt, media} rows",
    )
    p_score.add_argument("media", nargs="*", help="image/video files or folders (folders are read recursively)")

    p_cmp = sub.add_parser("compare", help="P(a better than b) for pairs of media")
    _add_model_args(p_cmp)
    p_cmp.add_argument("--prompt", help="the prompt of the pair (with A B)")
    p_cmp.add_argument("--pairs", help="a .jsonl file of {prompt, a, b} rows")
    p_cmp.add_argument("a", nargs="?", help="first medium")
    p_cmp.add_argument("b", nargs="?", help="second medium")
    _add_train_serve_parsers(sub)
    return parser


def _add_train_serve_parsers(sub) -> None:
    p = sub.add_parser("train-pref", help="train a Bradley-Terry preference head on preference pairs")
    p.add_argument("--data", required=True, help=".jsonl of {prompt, image_a, image_b, label} rows, or a datasets folder")
    p.add_argument("--out", required=True, help="output folder (loadable with mmreward.load(folder))")
    p.add_argument("--backbone", default="clipscore", help="CLIP-based reward giving the embeddings")
    p.add_argument("--backbone-checkpoint", default=None)
    p.add_argument("--backbone-weights", default="pretrained", choices=["pretrained", "random"])
    p.add_argument("--backbone-option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--head", default="linear", choices=["linear", "mlp", "clip"])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--val-fraction", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="force the CPU")

    s = sub.add_parser("serve", help="serve a reward over HTTP, on Ray Serve or in-process (loopback, bearer token "
                       "by default)")
    s.add_argument("--reward", required=True, help="registered name or source")
    s.add_argument("--checkpoint", default=None)
    s.add_argument("--weights", default="pretrained", choices=["pretrained", "random"])
    s.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="extra loader option (JSON value)")
    s.add_argument("--device", default=None)
    s.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; 0.0.0.0 exposes it)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--token", default=None, help="bearer token (default: generated and printed; or $MMREWARD_TOKEN)")
    s.add_argument("--no-auth", action="store_true", help="serve without a token (only on trusted networks)")
    s.add_argument("--max-batch-size", type=int, default=32)
    s.add_argument("--batch-wait-timeout-s", type=float, default=0.01)
    s.add_argument("--max-request-items", type=int, default=256)
    s.add_argument("--max-request-bytes", type=int, default=64 * 2**20)
    s.add_argument("--num-replicas", type=int, default=1)
    s.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica")
    s.add_argument("--engine", default="ray", choices=["ray", "local"],
                   help="ray: Ray Serve replicas; local: the reward in this process, no Ray (docs/serving.md)")
    h = s.add_argument_group("HTTP limits", "what one client may make the server hold, and for how long")
    h.add_argument("--max-header-line-bytes", type=int, default=8192, help="request line and each header line")
    h.add_argument("--max-headers", type=int, default=100, help="header fields per request")
    h.add_argument("--max-header-bytes", type=int, default=65536, help="the whole request head")
    h.add_argument("--header-timeout-s", type=float, default=10.0, help="from a request's first byte to its last header")
    h.add_argument("--idle-timeout-s", type=float, default=5.0, help="close a connection idle this long")
    h.add_argument("--body-timeout-s", type=float, default=120.0, help="the whole request body must arrive within this")
    h.add_argument("--max-connections", type=int, default=256, help="connections served at once (more get 503)")


def _options(pairs: Sequence[str], flag: str = "--option") -> dict[str, Any]:
    out = {}
    for item in pairs:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} expects KEY=VALUE (VALUE read as JSON), got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


# ----------------------------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------------------------
def _open_text(path: str, flag: str):
    """A UTF-8 text file named by a flag, or a ConfigError that says which flag and why."""
    p = Path(path)
    if not p.is_file():
        why = "is a folder" if p.is_dir() else "does not exist"
        raise ConfigError(f"{flag} {path} {why}; pass an existing file")
    try:
        return open(p, encoding="utf-8-sig")  # a BOM (Windows editors) is not part of the first line
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot read it ({exc.strerror})") from exc


def _text_lines(path: str, flag: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline), lazily; undecodable bytes are a ConfigError."""
    with _open_text(path, flag) as fh:
        lineno = 0
        try:
            for lineno, line in enumerate(fh, start=1):
                yield lineno, line.rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{flag} {path} line {lineno + 1} is not UTF-8 text ({exc.reason}); re-save the file as UTF-8"
            ) from exc


def _jsonl_rows(path: str, flag: str, media_keys: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """Validated rows of a JSONL file: media_keys are required strings, 'prompt' an optional string."""
    from mmreward.errors import RewardInputError
    from mmreward.types import normalize_prompts

    shape = "{" + ", ".join(f'"{k}": "..."' for k in ("prompt", *media_keys)) + "}"
    for lineno, line in _text_lines(path, flag):
        if not line.strip():
            continue
        where = f"{flag} {path} line {lineno}"
        from mmreward.safe_parse import UnsafeJSONError, safe_json

        try:
            row = safe_json(line)
        except UnsafeJSONError as exc:  # duplicate keys, deep nesting
            raise ConfigError(f"{where}: refused ({exc}); each line must be an object like {shape}") from None
        except ValueError as exc:
            raise ConfigError(f"{where}: not JSON ({exc}); each line must be an object like {shape}") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: expected a JSON object like {shape}, got {type(row).__name__}")
        for key in media_keys:
            if not isinstance(row.get(key), str) or not row[key]:
                got = "nothing" if key not in row else repr(row[key])
                raise ConfigError(f"{where}: '{key}' must be a media path (a string), got {got}; rows look like {shape}")
        prompt = row.get("prompt", "")
        if not isinstance(prompt, str):
            raise ConfigError(f"{where}: 'prompt' must be a string, got {type(prompt).__name__}")
        try:
            normalize_prompts(prompt, 1, required=False)
        except RewardInputError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        yield lineno, {"prompt": prompt, **{k: row[k] for k in media_keys}}


def _is_manifest(args: argparse.Namespace) -> bool:
    return bool(args.prompts) and Path(args.prompts).suffix == ".jsonl"


def _check_jobs(args: argparse.Namespace) -> None:
    """Read every input once before scoring (constant memory), so that usage errors come before any output."""
    from mmreward.media import iter_media_files
    from mmreward.types import normalize_prompts

    if args.prompt is not None:
        normalize_prompts(args.prompt, 1, required=False)
    if _is_manifest(args):
        if args.media:
            raise ConfigError("--prompts manifest.jsonl already names the media; do not also pass MEDIA paths")
        if not sum(1 for _ in _jsonl_rows(args.prompts, "--prompts", ("media",))):  # every row, not just one
            raise ConfigError(f"--prompts {args.prompts} has no rows; add {{\"prompt\", \"media\"}} lines")
        return
    if not args.media:
        raise ConfigError("no media given: pass image/video files or folders, or --prompts manifest.jsonl")
    if args.prompts:
        n_prompts = sum(1 for _ in _text_lines(args.prompts, "--prompts"))
        # listed once and kept: a second listing of a folder that changed in between would pair prompts with
        # other images (paths only, so memory stays small)
        args.media_files = [str(p) for p in iter_media_files(args.media)]
        n_media = len(args.media_files)
        if n_prompts != n_media:
            raise ConfigError(
                f"--prompts {args.prompts} has {n_prompts} lines but {n_media} media items were given; "
                "give exactly one prompt per line per item, in media order"
            )


def _iter_jobs(args: argparse.Namespace) -> Iterator[tuple[int, str, str]]:
    """(index, media path, prompt) in input order, lazily; `_check_jobs` has validated the inputs."""
    from mmreward.media import iter_media_files

    if _is_manifest(args):
        for i, (_, row) in enumerate(_jsonl_rows(args.prompts, "--prompts", ("media",))):
            yield i, row["media"], row["prompt"]
        return
    if args.prompts:
        files = getattr(args, "media_files", None)
        if files is None:
            files = [str(p) for p in iter_media_files(args.media)]
        for i, (path, (_, prompt)) in enumerate(zip(files, _text_lines(args.prompts, "--prompts"), strict=True)):
            yield i, str(path), prompt
        return
    for i, path in enumerate(iter_media_files(args.media)):
        yield i, str(path), args.prompt or ""


def _check_out(out: str | None) -> None:
    if not out:
        return
    if not out.endswith((".jsonl", ".csv")):
        raise ConfigError(f"--out must end in .jsonl or .csv, got {out!r}")
    p = Path(out)
    if p.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file name ending in .jsonl or .csv")
    parent = p.parent
    if not parent.is_dir():
        raise ConfigError(f"--out {out}: folder {parent} does not exist; create it first (mkdir -p {parent})")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"--out {out}: folder {parent} is not writable; pick another path")
    from mmreward.output_paths import check_output_folder

    check_output_folder(parent, f"--out {out}: folder")  # os.access says yes to root on a read-only mount


def _image_cap(args: argparse.Namespace) -> dict[str, int]:
    if args.max_image_pixels is None:
        return {}
    if args.max_image_pixels < 1:
        raise ConfigError(f"--max-image-pixels must be >= 1, got {args.max_image_pixels}")
    return {"max_image_pixels": args.max_image_pixels}


def _load_reward(args: argparse.Namespace):
    import mmreward
    from mmreward.registry import refuse_load_arguments

    options = _options(args.option)
    refuse_load_arguments(options, f"--option {' '.join(args.option)}", "use --checkpoint, --device, --dtype or --weights")
    try:
        return mmreward.load(args.reward, checkpoint=args.checkpoint, device=args.device, dtype=args.dtype,
                             weights=args.weights, **options)
    except MMRewardError:
        raise
    except (TypeError, ValueError) as exc:
        if not options:
            raise  # a bug, not a usage error: keep the traceback
        # loaders take their options as keyword arguments: unknown names and wrong types land here
        raise ConfigError(
            f"--option {' '.join(args.option)}: reward '{args.reward}' rejected these loader options ({exc}); "
            "check the option names and value types of this reward"
        ) from exc


def _shard(jobs: Iterable[tuple[int, str, str]], rank: int, world: int):
    for job in jobs:
        if job[0] % world == rank:
            yield job


def _batched(it: Iterable, n: int) -> Iterator[list]:
    batch = []
    for x in it:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


# ----------------------------------------------------------------------------------------------
# scoring
# ----------------------------------------------------------------------------------------------
def _video_load_options(reward) -> dict[str, Any]:
    """The reward's frame sampling for files (`Reward.video_load_options`); none for a duck-typed reward."""
    options = getattr(reward, "video_load_options", None)
    return options() if callable(options) else {}


def _score_batch(reward, jobs: list[tuple[int, str, str]], **media_options: Any) -> list[dict[str, Any]]:
    """Score a batch; an item that cannot be read, or that makes the model fail, gets its error recorded."""
    from mmreward import media as media_io

    rows: dict[int, dict[str, Any]] = {}
    loaded, ok_jobs = [], []
    modality = reward.modalities[0] if len(reward.modalities) == 1 else "auto"
    media_options = {**media_options, **_video_load_options(reward)}  # decode only the frames the card keeps
    for job in jobs:
        idx, path, prompt = job
        try:
            item = media_io.to_batch([path], modality=modality, alpha=reward.media_alpha, **media_options)
            loaded.append(item[0])
            ok_jobs.append(job)
        except (MMRewardError, OSError) as exc:
            rows[idx] = {"index": idx, "media": path, "prompt": prompt, "score": None, "error": str(exc)}

    def run(subjobs, items):
        out = reward.score([j[2] for j in subjobs], media_io.stack_if_same_size(items))
        for k, (idx, path, prompt) in enumerate(subjobs):
            row = {"index": idx, "media": path, "prompt": prompt, "score": float(out.scores[k]), "error": None}
            for key, val in out.details.items():
                if val.ndim == 1:
                    row[key] = float(val[k])
            if out.rationales is not None:
                row["rationale"] = out.rationales[k]
            rows[idx] = row

    if ok_jobs:
        try:
            run(ok_jobs, loaded)
        except Exception:  # noqa: BLE001 - isolate the failing item(s), whatever they made the model raise
            for job, item in zip(ok_jobs, loaded):
                try:
                    run([job], [item])
                except Exception as exc:  # noqa: BLE001 - one item's failure is its row's error, the run goes on
                    error = str(exc) if isinstance(exc, MMRewardError) else f"{type(exc).__name__}: {exc}"
                    rows[job[0]] = {"index": job[0], "media": job[1], "prompt": job[2], "score": None, "error": error}
    return [rows[j[0]] for j in jobs]


def _json_safe(value: Any) -> Any:
    """NaN and infinities are not JSON: write null (an empty CSV cell)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


class _Writer:
    """Writes rows as JSONL (streamed) or CSV.

    CSV columns are the union over all rows (a failed first row has no detail columns), so rows are
    buffered as JSONL in a temporary file next to the output and the CSV is written, then renamed into
    place, at `close()`: constant memory, and an interrupted run leaves no half-written CSV.
    """

    def __init__(self, path: str | None, stack: ExitStack, jsonl: bool = False):
        self.path = path
        self.is_csv = bool(path) and path.endswith(".csv") and not jsonl
        self.columns: dict[str, None] = {}  # an ordered set
        self._tmp: list[str] = []
        stack.callback(self._remove_tmp)
        if self.is_csv:
            self.fh = stack.enter_context(self._tmp_file(".rows.jsonl"))
        else:
            self.fh = stack.enter_context(open(path, "w", encoding="utf-8")) if path else sys.stdout

    def _tmp_file(self, suffix: str):
        out = Path(self.path)
        from mmreward.output_paths import remove_dead_temporaries

        remove_dead_temporaries(out.parent, out.name)  # rows files of a scoring run that was killed
        # the pid in the name tells a later run whether the writer is still alive
        fd, name = tempfile.mkstemp(prefix=f".{out.name}.{os.getpid()}.", suffix=suffix, dir=out.parent)
        self._tmp.append(name)
        return open(fd, "w", encoding="utf-8", newline="")

    def _remove_tmp(self) -> None:
        for name in self._tmp:
            if os.path.exists(name):
                os.remove(name)

    def write(self, row: dict[str, Any]) -> None:
        row = {k: _json_safe(v) for k, v in row.items()}
        self.columns.update(dict.fromkeys(row))
        self.fh.write(json.dumps(row, allow_nan=False) + "\n")
        if not self.is_csv:
            self.fh.flush()

    def close(self) -> None:
        """Finish the output (for CSV: write it with every column, then rename it into place)."""
        if not self.is_csv:
            return
        self.fh.close()
        with open(self._tmp[0], encoding="utf-8") as rows, self._tmp_file(".csv") as out:
            writer = csv.DictWriter(out, fieldnames=list(self.columns), restval="")
            writer.writeheader()
            for line in rows:
                writer.writerow(json.loads(line))
        os.replace(self._tmp[1], self.path)


def _dist_info() -> tuple[int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def cmd_score(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
    media_options = _image_cap(args)
    _check_out(args.out)
    _check_jobs(args)
    rank, world = _dist_info()
    state = None
    if world > 1:
        from accelerate import PartialState

        state = PartialState(cpu=not _cuda())
        rank, world = state.process_index, state.num_processes
    reward = _load_reward(args)
    if reward.requires_prompt and not (args.prompt or args.prompts):
        raise ConfigError(f"reward '{reward.name}' needs prompts: pass --prompt TEXT or --prompts FILE")
    jobs = _shard(_iter_jobs(args), rank, world)
    out_path = args.out if world == 1 else (f"{args.out or 'mmreward-scores.jsonl'}.rank{rank}.part")
    failed = 0
    from mmreward.output_paths import is_write_error, output_error

    try:
        with ExitStack() as stack:
            # parts are JSONL; rank 0 writes the final format
            writer = _Writer(out_path if world > 1 else args.out, stack, jsonl=world > 1)
            bar = stack.enter_context(tqdm(desc=f"scoring [{rank}/{world}]" if world > 1 else "scoring", unit="item",
                                           disable=args.no_progress, file=sys.stderr))
            for batch in _batched(jobs, args.batch_size):
                for row in _score_batch(reward, batch, **media_options):
                    failed += row["error"] is not None
                    writer.write(row)
                bar.update(len(batch))
            writer.close()
    except OSError as exc:  # items' own read errors are recorded per row; what is left here is the output's
        if not is_write_error(exc) or not args.out:
            raise
        raise output_error(exc, f"--out {args.out}") from None
    if world > 1:
        failed = _merge_parts(state, args.out, world, failed)
    if failed:
        print(f"mmreward: {failed} item(s) failed; see the 'error' field of the output", file=sys.stderr)
    return EXIT_ITEM_FAILED if failed else EXIT_OK


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _merge_parts(state, out: str | None, world: int, failed_here: int) -> int:
    """Wait for every rank, then rank 0 merges the per-rank JSONL parts (each sorted) in input order."""
    import torch
    import torch.distributed as dist

    counts = torch.tensor([failed_here])
    if dist.is_initialized():
        dist.all_reduce(counts)
    state.wait_for_everyone()
    if state.is_main_process:
        parts = [f"{out or 'mmreward-scores.jsonl'}.rank{r}.part" for r in range(world)]
        with ExitStack() as stack:
            streams = [(json.loads(line) for line in stack.enter_context(open(p))) for p in parts]
            writer = _Writer(out, stack)
            for row in heapq.merge(*streams, key=lambda r: r["index"]):
                writer.write(row)
            writer.close()
        for p in parts:
            os.remove(p)
    state.wait_for_everyone()
    return int(counts.item())


def cmd_compare(args: argparse.Namespace) -> int:
    from mmreward.types import normalize_prompts

    media_options = _image_cap(args)
    _check_out(args.out)
    if args.pairs:
        if args.a or args.b or args.prompt is not None:
            raise ConfigError("--pairs FILE.jsonl already names the prompts and media; do not also pass --prompt, A or B")
        n_pairs = sum(1 for _ in _jsonl_rows(args.pairs, "--pairs", ("a", "b")))  # validate before loading
        if not n_pairs:
            raise ConfigError(f"--pairs {args.pairs} has no rows; add {{\"prompt\", \"a\", \"b\"}} lines")
        rows: Iterable[dict[str, str]] = (row for _, row in _jsonl_rows(args.pairs, "--pairs", ("a", "b")))
    elif args.a and args.b:
        normalize_prompts(args.prompt or "", 1, required=False)
        rows = [{"prompt": args.prompt or "", "a": args.a, "b": args.b}]
    else:
        raise ConfigError("compare needs two media A B (with --prompt), or --pairs FILE.jsonl")
    reward = _load_reward(args)
    modality = reward.modalities[0] if len(reward.modalities) == 1 else "auto"
    media_options = {**media_options, **_video_load_options(reward)}
    failed = 0
    with ExitStack() as stack:
        writer = _Writer(args.out, stack)
        for i, row in enumerate(rows):
            out_row: dict[str, Any] = {"index": i, "prompt": row.get("prompt", ""), "a": row["a"], "b": row["b"]}
            try:
                from mmreward import media as media_io

                a = media_io.to_batch([row["a"]], modality=modality, alpha=reward.media_alpha, **media_options)
                b = media_io.to_batch([row["b"]], modality=modality, alpha=reward.media_alpha, **media_options)
                res = reward.compare([out_row["prompt"]], a, b)
                out_row.update(prob_a=float(res.prob_a[0]), error=None)
            except MMRewardError as exc:
                out_row.update(prob_a=None, error=str(exc))
                failed += 1
            writer.write(out_row)
        writer.close()
    return EXIT_ITEM_FAILED if failed else EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    from mmreward.registry import specs

    rows = []
    for name, spec in sorted(specs().items()):
        missing = spec.missing_requirements()
        rows.append({
            "name": name,
            "modalities": ",".join(spec.modalities),
            "differentiable": spec.differentiable,
            "default_checkpoint": spec.default_checkpoint or "-",
            "installed": "yes" if not missing else f"no: {spec.install_command()}",
            "description": spec.description,
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    cols = ["name", "modalities", "differentiable", "default_checkpoint", "installed"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  ".join(c.upper().ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in cols))
    return EXIT_OK


def cmd_train_pref(args: argparse.Namespace) -> int:
    from mmreward.train.preference import PrefTrainConfig, train

    cfg = PrefTrainConfig(
        data=args.data, out=args.out, backbone=args.backbone, backbone_checkpoint=args.backbone_checkpoint,
        backbone_weights=args.backbone_weights, backbone_options=_options(args.backbone_option, "--backbone-option"), head=args.head,
        lr=args.lr, epochs=args.epochs, batch_size=args.batch_size, val_fraction=args.val_fraction, seed=args.seed,
        cpu=args.cpu,
    )
    metrics = train(cfg)
    print(json.dumps(metrics))
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from mmreward.serve import ServeConfig, start
    from mmreward.types import check_device

    if args.device is not None:
        check_device(args.device)  # here, not deep inside a Ray replica

    cfg = ServeConfig(
        reward=args.reward, checkpoint=args.checkpoint, weights=args.weights, options=_options(args.option),
        device=args.device, host=args.host, port=args.port, token=args.token or os.environ.get("MMREWARD_TOKEN"),
        auth=not args.no_auth, max_batch_size=args.max_batch_size, batch_wait_timeout_s=args.batch_wait_timeout_s,
        max_request_items=args.max_request_items, max_request_bytes=args.max_request_bytes,
        num_replicas=args.num_replicas, num_gpus=args.num_gpus, max_header_line_bytes=args.max_header_line_bytes,
        max_headers=args.max_headers, max_header_bytes=args.max_header_bytes, header_timeout_s=args.header_timeout_s,
        idle_timeout_s=args.idle_timeout_s, body_timeout_s=args.body_timeout_s, max_connections=args.max_connections,
        engine=args.engine,
    )
    if cfg.auth and not (args.token or os.environ.get("MMREWARD_TOKEN")):
        print(f"mmreward serve: generated bearer token: {cfg.token}", file=sys.stderr, flush=True)
    url = start(cfg)
    print(f"mmreward serve: '{args.reward}' at {url} (POST /score, /compare, /scorer; GET /healthz, /metrics)", file=sys.stderr, flush=True)
    import time

    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        from mmreward.serve import shutdown

        shutdown()
    return EXIT_OK


COMMANDS = {"list": cmd_list, "score": cmd_score, "compare": cmd_compare, "train-pref": cmd_train_pref,
            "serve": cmd_serve}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()

    def dispatch(args: argparse.Namespace) -> int:
        if args.version:
            from mmreward import __version__

            print(__version__)
            return EXIT_OK
        if args.command is None:
            raise ConfigError(f"no command given; choose one of {', '.join(COMMANDS)} (see mmreward --help)")
        return COMMANDS[args.command](args)

    return run_main(parser, argv, dispatch, "mmreward")
