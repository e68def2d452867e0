"""A recorded mutation run over the code that keeps the promises of docs/reliability.md: each
mutant breaks one promise for real, and the tests that hold that promise must fail on it.

    .venv/bin/python scripts/mutations.py                 # baselines, the isolation check, every mutant
    .venv/bin/python scripts/mutations.py --list          # the mutants, their promise and their tests
    .venv/bin/python scripts/mutations.py --only ID,ID    # these mutants (their entries in --out are replaced)

Each mutant is one exact replacement in one source file (the snippet must occur exactly once,
else the script refuses: the list cannot silently rot as the code changes), run in a fresh
scratch copy of the repository (src/, tests/ and the rest, not .git or .venv) under the system's
temporary directory, with ``ELMO_SHARED`` pointing at ../shared and ``PYTHONPATH`` at the copy's
src/, so that the copy's code is what gets imported and not the editable install's (checked once
per run by a deliberate syntax error, which must fail its tests and name the copy's file). Its
selection runs as ``python -m pytest -x -q -p no:cacheprovider SELECTION`` (plus ``-o addopts=``,
so that pyproject.toml's own ``-q`` does not hide the tally, and ``--basetemp`` inside the copy)
under ``nice -n 19`` with ``OMP_NUM_THREADS=1`` and a time limit (``--timeout``).

Statuses: ``killed`` (the selection fails), ``survived`` (it passes), ``timeout``, and
``baseline-failed`` (the unmutated copy fails that selection, run once per selection first, so
the mutant's result would mean nothing). A survivor is either killed by a new test (one of
``WRITTEN_FOR_SURVIVORS``, added to its selection) or carries ``survives_because``: why no test
can reasonably tell it apart.

The record, ``results/mutation.json``: per mutant its id, file, description, selection, status,
seconds, the first failing test and the first lines of its failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ELMO_SHARED", ROOT.parent / "shared"))
OUT = ROOT / "results" / "mutation.json"
COPIED = ("src", "tests", "benchmarks", "scripts", "configs", "examples", "docs")
TIMEOUT = 900.0   # seconds for one selection

# The tests written for the survivors of a first run, each to kill one (the record's "new_test").
WRITTEN_FOR_SURVIVORS = {
    "test_the_writers_lock_covers_a_temporary_file_the_writer_replaced",
    "test_a_signal_while_the_interpreter_shuts_down_changes_no_status",
    "test_a_pinned_digest_outranks_a_rewritten_record", "test_the_size_limit_is_exact",
    "test_a_full_disk_stops_embedding_at_once", "test_a_write_that_fails_in_the_closing_flush_leaves_no_output",
    "test_a_simulated_full_disk_in_embed_merge_leaves_nothing",
    "test_a_simulated_full_disk_while_checkpointing_keeps_the_previous_checkpoint",
}
SIGNAL_INSIDE_H5PY = "tests/test_signals.py::test_a_signal_inside_h5pys_own_writes_is_never_lost"
FULL_DISK_EMBED = "tests/test_writes.py::test_full_disk_in_embed_is_one_line_error_and_leaves_nothing"
FULL_DISK_CKPT = "tests/test_writes.py::test_full_disk_while_checkpointing_keeps_the_previous_checkpoint"
STALE = "tests/test_writes.py::test_later_runs_remove_stale_temp_files_of_their_own_naming"
SWEEP_LOCK = "tests/test_writes.py::test_the_sweep_spares_a_live_writer_whose_pid_looks_dead"
EXPORT_WHOLE = "tests/test_export.py::test_export_writes_out_whole_or_not_at_all"
FAILED_EMBED = "tests/test_embed.py::test_failed_run_leaves_no_output"
DESTINATION = "tests/test_bad_input.py::test_average_and_perplexity_check_their_destination_before_any_work"
CALLER_CHECK = "tests/test_downloads.py::test_a_download_gets_the_check_of_what_the_caller_loads_whatever_its_url"
NO_RECORD = "tests/test_downloads.py::test_an_entry_without_its_record_is_never_trusted_on_its_content"


@dataclasses.dataclass(frozen=True)
class Mutation:
    id: str
    file: str             # relative to the repository root
    description: str      # the promise it breaks, in one line
    find: str             # the exact snippet, which must occur once in ``file``
    replace: str
    selection: tuple[str, ...]   # pytest arguments: test files or node ids, -k expressions
    survives_because: str | None = None


MUTATIONS = [
    Mutation(
        "owned-directory-written-through-link", "src/torchelmo/io/fileio.py",
        "a link planted where a run or a pipeline keeps its own model folder is written through: the directory it points to is overwritten",
        "        if path.is_symlink():\n            path.unlink()\n",
        "",
        ("tests/test_resume_and_repeat.py::test_a_run_writes_its_model_folders_over_links_not_through_them",
         "tests/test_spacy.py::test_to_disk_replaces_a_link_in_the_pipeline_instead_of_writing_through_it")),
    # -- corpus.py: what a saved position is valid for ------------------------------------------
    Mutation(
        "corpus-fingerprint-sizes-only", "src/torchelmo/lm/corpus.py",
        "a resumed run's training files are fingerprinted by names and sizes only: an edit that keeps the size is not seen",
        "        return [[f.name, f.stat().st_size, file_digest(f)] for f in self.files]\n",
        "        return [[f.name, f.stat().st_size] for f in self.files]\n",
        ("tests/test_train.py::test_an_edit_that_keeps_the_size_is_refused_on_resume",)),
    # -- fileio.py: atomic outputs ------------------------------------------------------------
    Mutation(
        "atomic-writes-in-place", "src/torchelmo/io/fileio.py",
        "atomic_path hands out the final name: a failure leaves a partial file there (and removes the previous one)",
        "    try:\n        yield tmp_path\n",
        "    try:\n        tmp_path.unlink()\n        tmp_path = path\n        yield tmp_path\n",
        (FAILED_EMBED,)),
    Mutation(
        "atomic-keeps-temporary-on-failure", "src/torchelmo/io/fileio.py",
        "atomic_path leaves its temporary file behind when the work fails",
        "    except BaseException:\n        tmp_path.unlink(missing_ok=True)\n        raise\n",
        "    except BaseException:\n        raise\n",
        (FAILED_EMBED,)),
    Mutation(
        "atomic-skips-directory-check", "src/torchelmo/io/fileio.py",
        "atomic_path does not refuse a directory before the work: the error comes only at the rename",
        '    path = Path(path)\n    if path.is_dir():\n        raise ElmoError(f"{path}: is a directory; give a file name to write")\n'
        "    try:\n",
        "    path = Path(path)\n    try:\n",
        ("tests/test_bad_input.py::test_read_only_place_and_directory_output_fail_before_any_work",)),
    Mutation(
        "atomic-copies-into-place", "src/torchelmo/io/fileio.py",
        "atomic_path copies its temporary file onto the output and deletes it, instead of renaming it: a reader sees a partial output",
        "            os.replace(tmp_path, path)\n",
        "            import shutil; shutil.copyfile(tmp_path, path); os.unlink(tmp_path)\n",
        ("tests/test_writes.py::test_a_watcher_never_sees_a_partial_output",)),
    Mutation(
        "atomic-no-fsync", "src/torchelmo/io/fileio.py",
        "atomic_path renames its temporary file without fsyncing it first",
        '            with open(tmp_path, "rb") as f:\n                os.fsync(f.fileno())\n',
        "",
        (FAILED_EMBED, EXPORT_WHOLE, SWEEP_LOCK),
        survives_because=(
            "fsync decides only what survives a power cut or a kernel crash: in a running system the page "
            "cache serves the renamed file whole whether or not it reached the disk, so no test short of "
            "cutting the machine's power (or a fault-injecting block device) can tell the mutant apart; a "
            "test that mocks os.fsync and asserts the call would check the code's text, not its behaviour")),
    Mutation(
        "atomic-no-relock", "src/torchelmo/io/fileio.py",
        "a temporary file that its writer replaced (safetensors does) is renamed into place without the writer's lock",
        "            fd = _relock(tmp_path, fd)\n",
        "",
        (SWEEP_LOCK, "tests/test_writes.py::test_the_writers_lock_covers_a_temporary_file_the_writer_replaced")),
    Mutation(
        "guarded-writer-reraises", "src/torchelmo/io/fileio.py",
        "GuardedWriter re-raises a failed write into HDF5, which cannot take one",
        "            except OSError as e:\n                self.error = e\n        return memoryview(data).nbytes\n",
        "            except OSError as e:\n                self.error = e\n                raise\n"
        "        return memoryview(data).nbytes\n",
        (FULL_DISK_EMBED, "tests/test_writes.py::test_a_full_disk_stops_embedding_at_once")),
    # -- fileio.py: the stale-temporary sweep -----------------------------------------------------
    Mutation(
        "sweep-ignores-the-writers-lock", "src/torchelmo/io/fileio.py",
        "the sweep judges a temporary file by host and PID alone, removing a live writer's in another PID namespace",
        "        if lock_file(fd) is False:",
        "        if False:",
        (SWEEP_LOCK,)),
    Mutation(
        "sweep-ignores-the-pid", "src/torchelmo/io/fileio.py",
        "the sweep removes an unlocked temporary file whose writer (an older version's) is still running",
        "        if _pid_running(pid):",
        "        if False:",
        (STALE,)),
    Mutation(
        "sweep-touches-other-hosts", "src/torchelmo/io/fileio.py",
        "the sweep removes temporary files of other hosts",
        "if parts[0] == host and p.is_file()",
        "if p.is_file()",
        (STALE,)),
    Mutation(
        "sweep-removes-fresh-legacy-files", "src/torchelmo/io/fileio.py",
        "the sweep removes old-style temporary files without waiting an hour",
        "len(parts) == 1 and time.time() - p.stat().st_mtime > LEGACY_STALE_SECONDS and p.is_file()",
        "len(parts) == 1 and p.is_file()",
        (STALE,)),
    Mutation(
        "sweep-never-runs", "src/torchelmo/io/fileio.py",
        "a temporary file left by a killed writer is never removed by the next write of its name",
        "        remove_stale_temporaries(path)\n",
        "",
        (STALE,)),
    # -- fileio.py: destinations checked before the work ------------------------------------------
    Mutation(
        "destination-permission-unchecked", "src/torchelmo/io/fileio.py",
        "check_destination does not refuse a place without write permission",
        "    if not os.access(place, os.W_OK | os.X_OK):",
        "    if False:",
        (DESTINATION,)),
    Mutation(
        "destination-read-only-unchecked", "src/torchelmo/io/fileio.py",
        "check_destination does not refuse a read-only file system",
        "    if read_only:\n",
        "    if False:\n",
        (DESTINATION,)),
    # -- signals.py ------------------------------------------------------------------------------
    Mutation(
        "interrupts-never-hold", "src/torchelmo/signals.py",
        "Interrupts raises a signal at once even inside critical(), where h5py would swallow it",
        "        if self._depth:\n",
        "        if False:\n",
        (f"{SIGNAL_INSIDE_H5PY}[SIGINT-writing-1]", f"{SIGNAL_INSIDE_H5PY}[SIGINT-closing-1]")),
    Mutation(
        "interrupts-drop-pending", "src/torchelmo/signals.py",
        "a signal held inside critical() is dropped when the section ends",
        "                self.pending = None\n                raise KeyboardInterrupt\n",
        "                self.pending = None\n",
        (f"{SIGNAL_INSIDE_H5PY}[SIGINT-writing-1]", f"{SIGNAL_INSIDE_H5PY}[SIGINT-closing-1]")),
    Mutation(
        "sigterm-not-handled", "src/torchelmo/signals.py",
        "SIGTERM gets the default handling (the process dies, no cleanup, no one-line message)",
        "SIGNALS = (signal.SIGINT, signal.SIGTERM)",
        "SIGNALS = (signal.SIGINT,)",
        (f"{SIGNAL_INSIDE_H5PY}[SIGTERM-closing-5]",)),
    Mutation(
        "work-done-ignored", "src/torchelmo/signals.py",
        "a signal after OUTPUT is complete turns the command's success into 'interrupted'",
        "def work_done() -> bool:\n    return _work_done\n",
        "def work_done() -> bool:\n    return False\n",
        ("tests/test_runtime.py::test_a_signal_after_the_output_is_complete_changes_nothing",)),
    Mutation(
        "signals-not-ignored-at-exit", "src/torchelmo/signals.py",
        "the installed elmo does not ignore signals while the interpreter shuts down: its decided status can change",
        "        signal.signal(sig, signal.SIG_IGN)\n",
        "        pass\n",
        ("tests/test_runtime.py::test_a_signal_after_the_output_is_complete_changes_nothing",
         "tests/test_signals.py::test_a_signal_while_the_interpreter_shuts_down_changes_no_status")),
    # -- download.py ---------------------------------------------------------------------------
    Mutation(
        "entry-without-record-trusted", "src/torchelmo/io/download.py",
        "a cached file without its digest record is used as it stands",
        "    return want is not None and _sha256(target) == want\n",
        "    return want is None or _sha256(target) == want\n",
        (NO_RECORD,)),
    Mutation(
        "digest-of-the-first-mib", "src/torchelmo/io/download.py",
        "a file's digest covers only its first MiB: a cached file changed past it is used as if intact",
        "        for chunk in iter(lambda: f.read(1 << 20), b\"\"):\n            h.update(chunk)\n",
        "        h.update(f.read(1 << 20))\n",
        ("tests/test_downloads.py::test_a_change_past_the_first_mib_of_a_cached_file_is_caught",)),
    Mutation(
        "pin-ignored-on-use", "src/torchelmo/io/download.py",
        "a cache entry is trusted by its record even where a digest is pinned",
        "    want = sha256 or (digest_file",
        "    want = (digest_file",
        (NO_RECORD, "tests/test_weights.py::test_download_cache_offline_checksum",
         "tests/test_downloads.py::test_a_pinned_digest_outranks_a_rewritten_record")),
    Mutation(
        "html-body-accepted", "src/torchelmo/io/download.py",
        "an HTML page sent with status 200 is cached as the file",
        '    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):\n',
        "    if False:\n",
        (CALLER_CHECK,)),
    Mutation(
        "empty-body-accepted", "src/torchelmo/io/download.py",
        "an empty download is cached",
        "    if not head:\n",
        "    if False:\n",
        (CALLER_CHECK,)),
    Mutation(
        "content-length-mismatch-accepted", "src/torchelmo/io/download.py",
        "a body shorter than its Content-Length is accepted",
        "    if expected is not None and got != expected:\n",
        "    if False:\n",
        ("tests/test_downloads.py::test_a_cut_off_download_is_never_cached",)),
    Mutation(
        "pinned-sha256-ignored", "src/torchelmo/io/download.py",
        "a download that does not match its pinned SHA-256 is cached",
        '            if sha256 is not None and got != sha256:\n                raise ElmoError(f"{s}: checksum mismatch',
        '            if False:\n                raise ElmoError(f"{s}: checksum mismatch',
        ("tests/test_downloads.py::test_cache_entries_are_checked_on_use",)),
    Mutation(
        "no-deadline", "src/torchelmo/io/download.py",
        "a download has no deadline: a server trickling bytes holds it for ever",
        "    with _Watchdog(deadline) as watch:\n",
        "    with _Watchdog(1e9) as watch:\n",
        ("tests/test_downloads.py::test_a_download_ends_within_its_deadline[/slow-headers]",)),
    Mutation(
        "announced-size-unchecked", "src/torchelmo/io/download.py",
        "a Content-Length over the size limit is not refused before the body is read",
        "                if expected is not None and expected > max_bytes:\n",
        "                if False:\n",
        ("tests/test_downloads.py::test_a_download_has_a_size_limit",)),
    Mutation(
        "size-limit-doubled", "src/torchelmo/io/download.py",
        "a body without Content-Length may grow to twice the size limit",
        "                        if got > max_bytes:\n",
        "                        if got > 2 * max_bytes:\n",
        ("tests/test_downloads.py::test_a_download_has_a_size_limit", "tests/test_downloads.py::test_the_size_limit_is_exact")),
    Mutation(
        "redirect-to-any-scheme", "src/torchelmo/io/download.py",
        "redirects to schemes other than http(s) are followed (urllib alone follows ftp:)",
        '        if scheme not in ("http", "https"):\n',
        "        if False:\n",
        ("tests/test_downloads.py::test_redirects_to_other_schemes_are_refused[ftp://127.0.0.1/w.hdf5]",)),
    # -- train/checkpoint.py ----------------------------------------------------------------------
    Mutation(
        "checkpoint-weights-only-false", "src/torchelmo/train/checkpoint.py",
        "checkpoints are unpickled with weights_only=False: a planted pickle runs code",
        'ckpt = torch.load(path, map_location="cpu", weights_only=True)',
        'ckpt = torch.load(path, map_location="cpu", weights_only=False)',
        ("tests/test_untrusted_files.py::test_a_checkpoint_holding_os_system_is_refused_by_name",)),
    Mutation(
        "checkpoint-saved-in-place", "src/torchelmo/train/checkpoint.py",
        "checkpoint.pt is written in place: a failure destroys the previous checkpoint",
        "    with atomic_path(path) as tmp:\n        # Through a GuardedWriter",
        '    with __import__("contextlib").nullcontext(path) as tmp:\n        # Through a GuardedWriter',
        (FULL_DISK_CKPT, "tests/test_writes.py::test_a_simulated_full_disk_while_checkpointing_keeps_the_previous_checkpoint")),
    Mutation(
        "checkpoint-write-error-ignored", "src/torchelmo/train/checkpoint.py",
        "a checkpoint whose write failed is renamed into place as if complete",
        "        if out.error is not None:\n            raise write_error(path, out.error",
        "        if False:\n            raise write_error(path, out.error",
        (FULL_DISK_CKPT, "tests/test_writes.py::test_a_simulated_full_disk_while_checkpointing_keeps_the_previous_checkpoint")),
    Mutation(
        "kept-checkpoints-not-pruned", "src/torchelmo/train/checkpoint.py",
        "--keep-checkpoints keeps every snapshot instead of the last N",
        '    for old in sorted(kept.glob("step-*.pt"))[:-keep]:\n',
        '    for old in sorted(kept.glob("step-*.pt"))[:0]:\n',
        ("tests/test_average.py::test_keep_checkpoints_keeps_the_last_n",)),
    # -- export.py -------------------------------------------------------------------------------
    Mutation(
        "export-written-in-place", "src/torchelmo/integrations/onnx.py",
        "export writes OUT in place: a failed verification or an interrupt destroys the previous export",
        "    with atomic_path(out) as tmp:\n        bilm = model",
        '    with __import__("contextlib").nullcontext(Path(out)) as tmp:\n        bilm = model',
        (EXPORT_WHOLE,)),
    Mutation(
        "export-verification-skipped", "src/torchelmo/integrations/onnx.py",
        "an export that differs from the eager model is installed anyway",
        "        if not diff <= 1e-4:\n",
        "        if False:\n",
        (EXPORT_WHOLE,)),
    Mutation(
        "export-destination-checked-after-load", "src/torchelmo/integrations/onnx.py",
        "export loads the model before finding that OUT is a directory",
        "    with atomic_path(out) as tmp:\n        bilm = model if isinstance(model, BiLM) else BiLM.from_pretrained(model)\n",
        "    bilm = model if isinstance(model, BiLM) else BiLM.from_pretrained(model)\n    with atomic_path(out) as tmp:\n",
        (EXPORT_WHOLE,)),
    # -- embed/writer.py, embed/hdf5.py ---------------------------------------------------------
    Mutation(
        "h5-write-outside-critical", "src/torchelmo/embed/writer.py",
        "the embed writer calls h5py's create_dataset outside interrupts.critical(): a signal there is lost",
        "        with self.interrupts.critical():\n            self.file.create_dataset(",
        "        if True:\n            self.file.create_dataset(",
        (f"{SIGNAL_INSIDE_H5PY}[SIGINT-writing-1]", f"{SIGNAL_INSIDE_H5PY}[SIGINT-writing-40]"),
        survives_because=(
            "equivalent under h5py 3.16: every write of create_dataset goes through h5py's file-object driver "
            "inside make_new_dset (none from a destructor), and that driver hands a KeyboardInterrupt raised in "
            "its write callback back to Python, so the signal ends the run as 'interrupted' with or without "
            "the critical section; a SIGINT sent at every 6th of the 302 writes of a 300-line run, as "
            "test_a_signal_inside_h5pys_own_writes_is_never_lost sends it, always ended with status 130, no "
            "OUTPUT and no 'Exception ignored'. The section stays as defence for other h5py versions "
            "(h5py>=3.8 is allowed) and is what the close, where the signal is lost, needs")),
    Mutation(
        "h5-close-outside-critical", "src/torchelmo/embed/writer.py",
        "the embed writer closes the HDF5 file outside interrupts.critical(): a signal during its flush is lost",
        "            with self.interrupts.critical():\n                if self.file is not None:\n",
        "            if True:\n                if self.file is not None:\n",
        (f"{SIGNAL_INSIDE_H5PY}[SIGINT-closing-1]", f"{SIGNAL_INSIDE_H5PY}[SIGINT-closing-20]")),
    Mutation(
        "h5-write-error-unchecked", "src/torchelmo/embed/writer.py",
        "a failed dataset write is not noticed at once: the run embeds the rest of the input into a full disk",
        '            self.file.create_dataset(name, data=arr, dtype="float32")\n        self.check()\n',
        '            self.file.create_dataset(name, data=arr, dtype="float32")\n',
        (FULL_DISK_EMBED, "tests/test_writes.py::test_a_full_disk_stops_embedding_at_once")),
    Mutation(
        "h5-close-error-unchecked", "src/torchelmo/embed/writer.py",
        "a write that fails while the close flushes goes unnoticed: a damaged OUTPUT is renamed into place",
        "        if exc[0] is None:\n            self.check()",
        "        if False:\n            self.check()",
        (FULL_DISK_EMBED, "tests/test_writes.py::test_a_write_that_fails_in_the_closing_flush_leaves_no_output")),
    Mutation(
        "merge-written-in-place", "src/torchelmo/embed/hdf5.py",
        "embed-merge writes OUTPUT in place: a full disk leaves a partial file under its name",
        "        with Interrupts() as interrupts, atomic_path(output_path) as tmp, \\\n",
        '        with Interrupts() as interrupts, __import__("contextlib").nullcontext(output_path) as tmp, \\\n',
        (FULL_DISK_EMBED, "tests/test_writes.py::test_a_simulated_full_disk_in_embed_merge_leaves_nothing")),
    # -- train/metrics.py ------------------------------------------------------------------------
    Mutation(
        "metrics-not-trimmed-on-resume", "src/torchelmo/train/metrics.py",
        "a resumed run keeps the metrics lines logged after its checkpoint, then logs those steps again",
        'if entry["step"] <= resumed_at:',
        "if True:",
        ("tests/test_resume_and_repeat.py::test_resume_drops_the_metrics_logged_after_the_checkpoint",)),
    Mutation(
        "metrics-damage-accepted", "src/torchelmo/train/metrics.py",
        "a metrics line whose step is not a whole number is kept on resume (the run's log read as trusted)",
        "        if isinstance(step, bool) or not isinstance(step, int) or step < 0:\n",
        "        if False:\n",
        ("tests/test_untrusted_files.py::test_tampered_run_files_are_one_line_refusals_on_resume",)),
    # -- train/checkpoint.py: one trainer per run, a checkpoint read as untrusted input ---------
    Mutation(
        "run-lock-ignored", "src/torchelmo/train/checkpoint.py",
        "a second trainer on a held run directory goes ahead (resumes or deletes the run under the first)",
        "        if taken is False:\n",
        "        if False:\n",
        ("tests/test_resume_and_repeat.py::test_a_second_trainer_on_a_run_directory_is_refused_in_one_line",)),
    Mutation(
        "vocabulary-digest-unchecked", "src/torchelmo/train/checkpoint.py",
        "resume accepts a vocabulary whose words were swapped or added",
        "    if saved is not None and saved != vocab.digest:\n",
        "    if False:\n",
        ("tests/test_resume_and_repeat.py::test_resume_refuses_a_changed_vocabulary_in_one_line",)),
    Mutation(
        "checkpoint-counters-unchecked", "src/torchelmo/train/checkpoint.py",
        "a checkpoint's step, counters and states are used as they are (a step of -5 trains on silently)",
        "    for name, ok, what in checks:\n        if not ok:\n",
        "    for name, ok, what in checks:\n        if False:\n",
        ("tests/test_untrusted_files.py::test_tampered_run_files_are_one_line_refusals_on_resume",)),
    # -- io/fileio.py: bounded reads ------------------------------------------------------------
    Mutation(
        "small-file-kind-unchecked", "src/torchelmo/io/fileio.py",
        "a directory, device or FIFO given as a small file is read (hangs on a FIFO, reads /dev/zero up to the cap)",
        "        if not stat.S_ISREG(st.st_mode):\n",
        "        if False:\n",
        ("tests/test_untrusted_files.py::test_every_small_file_is_read_with_bounds",)),
    Mutation(
        "metrics-last-validation-forgotten", "src/torchelmo/train/metrics.py",
        "a resumed run forgets the last validation kept from before its checkpoint (a finished run resumed "
        "reports none)",
        "                        self.last_valid = entry\n",
        "                        pass\n",
        ("tests/test_resume_and_repeat.py::test_resuming_a_finished_run_adds_no_metrics_line",
         "tests/test_resume_and_repeat.py::test_resume_drops_the_metrics_logged_after_the_checkpoint")),
]

# The isolation check: a syntax error in the copy must fail the tests, which proves that the
# copy's src/ is what they import (not the checkout's src/ through the editable install).
ISOLATION = Mutation(
    "isolation-check", "src/torchelmo/io/fileio.py",
    "a deliberate syntax error: must fail, else the tests import some other copy of torchelmo",
    "def _host() -> str:\n", "def _host() -> str:\n    ) not python (\n",
    ("tests/test_resume_and_repeat.py::test_resume_drops_the_metrics_logged_after_the_checkpoint",))


# ------------------------------------------------------------------------------------------------
def check_list(mutations: list[Mutation], root: Path = ROOT) -> None:
    """Refuse a list that has rotted: an id twice, or a snippet not found exactly once."""
    seen = set()
    problems = []
    for m in mutations:
        if m.id in seen:
            problems.append(f"{m.id}: id used twice")
        seen.add(m.id)
        text = (root / m.file).read_text(encoding="utf-8")
        n = text.count(m.find)
        if n != 1:
            problems.append(f"{m.id}: its snippet occurs {n} times in {m.file}, not once")
        if m.find == m.replace:
            problems.append(f"{m.id}: the replacement equals the snippet")
        if not isinstance(m.selection, tuple) or not m.selection:
            problems.append(f"{m.id}: its selection must be a non-empty tuple of pytest arguments")
            continue
        for arg in m.selection:
            path = arg.split("::")[0]
            if not arg.startswith("-") and not (root / path).exists():
                problems.append(f"{m.id}: selection {arg!r}: {path} does not exist")
    if problems:
        sys.exit("mutations.py: the list does not fit the code:\n  " + "\n  ".join(problems))


def scratch_copy(source: Path = ROOT, prefix: str = "torchelmo-mutant-") -> Path:
    """A fresh copy of ``source``'s working tree (not .git, .venv or run outputs)."""
    dest = Path(tempfile.mkdtemp(prefix=prefix))
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".pytest-tmp", "*.pyc")
    for name in COPIED:
        if (source / name).is_dir():
            shutil.copytree(source / name, dest / name, ignore=ignore, symlinks=True)
    for p in source.iterdir():
        if p.is_file() and p.stat().st_size < 1 << 20:   # pyproject.toml, README.md, ...; not stray outputs
            shutil.copy2(p, dest / p.name)
    return dest


def environment(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(copy / "src"), ELMO_SHARED=str(SHARED), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("ELMO_OFFLINE", None)
    return env


def first_failure(output: str) -> tuple[str | None, list[str]]:
    """The first failing test's name (pytest's short summary) and the first ``E`` lines."""
    name = None
    for line in output.splitlines():
        found = re.match(r"(?:FAILED|ERROR) (\S+)", line)
        if found:
            name = found.group(1)
            break
    errors = [ln.rstrip() for ln in output.splitlines() if ln.startswith("E ")][:6]
    return name, errors


def counts(output: str) -> str:
    """pytest's final tally (``2 passed, 1 skipped in 9.1s``), or ''."""
    for line in reversed(output.splitlines()):
        if re.search(r"\b(passed|failed|error|errors|skipped|no tests ran)\b", line) and " in " in line:
            return line.strip("= ").strip()
    return ""


def run_selection(selection: tuple[str, ...], copy: Path, timeout: float) -> dict:
    # -o addopts=: pyproject.toml's own -q would make it -qq, which drops the tally line
    # --basetemp inside the copy: the tests' temporary directories go with it, and pytest's
    # rotation of the default pytest-of-USER directory (shared with whoever else runs tests here) is left alone.
    cmd = ["nice", "-n", "19", sys.executable, "-m", "pytest", "-o", "addopts=", "-x", "-q", "-p", "no:cacheprovider",
           f"--basetemp={copy / '.pytest-tmp'}", *selection]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=copy, env=environment(copy), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # the selection's own process group, which it leads
        output, _ = proc.communicate()
        rc = None
    seconds = round(time.monotonic() - t0, 1)
    # The record names no machine paths: the scratch copy and the checkout by placeholder.
    output = output.replace(str(copy), "<copy>").replace(str(ROOT), "<repo>")
    name, errors = first_failure(output)
    return {"rc": rc, "seconds": seconds, "output": output, "first_failure": name, "errors": errors,
            "tally": counts(output)}


def apply(m: Mutation, copy: Path) -> None:
    path = copy / m.file
    text = path.read_text(encoding="utf-8")
    if text.count(m.find) != 1:
        raise SystemExit(f"{m.id}: snippet not found once in the copy of {m.file}")
    path.write_text(text.replace(m.find, m.replace), encoding="utf-8")


def run_mutated(m: Mutation, snapshot: Path, timeout: float, keep: bool = False) -> dict:
    """``m`` applied to a scratch copy of ``snapshot``, its selection run there
    (:func:`run_selection`'s result); the copy is removed afterwards unless ``keep``."""
    copy = scratch_copy(snapshot)
    try:
        apply(m, copy)
        return run_selection(m.selection, copy, timeout)
    finally:
        if not keep:
            shutil.rmtree(copy, ignore_errors=True)


def isolation_check(snapshot: Path, timeout: float, keep: bool = False) -> dict:
    """The deliberate syntax error: its selection must fail, and the error must name the copy's
    file (not the checkout's)."""
    r = run_mutated(ISOLATION, snapshot, timeout, keep)
    mutated = f"<copy>/{ISOLATION.file}"
    ok = r["rc"] not in (0, None) and "SyntaxError" in r["output"] and mutated in r["output"]
    return {"status": "killed" if ok else "NOT ISOLATED", "returncode": r["rc"], "first_failure": r["first_failure"],
            "syntax_error_in": mutated if mutated in r["output"] else None,
            "errors": [ln for ln in r["output"].splitlines() if "SyntaxError" in ln or mutated in ln][:3]}


def run_mutant(m: Mutation, snapshot: Path, timeout: float, baseline: dict | None, keep: bool = False) -> dict:
    entry = {"id": m.id, "file": m.file, "description": m.description, "selection": list(m.selection)}
    if baseline is not None and baseline["rc"] != 0:
        entry.update(status="baseline-failed", seconds=0.0, first_failure=baseline["first_failure"],
                     errors=baseline["errors"], tally=baseline["tally"])
    else:
        r = run_mutated(m, snapshot, timeout, keep)
        status = "timeout" if r["rc"] is None else "survived" if r["rc"] == 0 else "killed"
        entry.update(status=status, seconds=r["seconds"], first_failure=r["first_failure"], errors=r["errors"],
                     tally=r["tally"], returncode=r["rc"])
        if status == "killed" and r["rc"] not in (1, 2):
            # not pytest's "tests failed" or "interrupted/collection error": the run itself died
            entry["note"] = f"pytest ended with status {r['rc']} (a signal or crash, not a failed assertion)"
    if m.survives_because:
        entry["survives_because"] = m.survives_because
    entry["new_test"] = any(arg.split("::")[-1] in WRITTEN_FOR_SURVIVORS for arg in m.selection)
    return entry


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    found = {"python": sys.version.split()[0]}
    for name in ("torch", "h5py", "pytest"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    found["root"] = str(os.geteuid() == 0) if hasattr(os, "geteuid") else "n/a"   # the tmpfs tests need it
    return found


def table(entries: list[dict]) -> str:
    width = max(len(e["id"]) for e in entries)
    lines = [f"{'mutant':<{width}}  {'status':<15} {'seconds':>7}  killed by / why it survives"]
    for e in entries:
        why = e.get("first_failure") or ""
        if e["status"] == "survived":
            why = "survives_because: " + (e.get("survives_because") or "-- UNEXPLAINED --")[:70]
        lines.append(f"{e['id']:<{width}}  {e['status']:<15} {e['seconds']:>7.1f}  {why}")
    return "\n".join(lines)


def summary(entries: list[dict]) -> str:
    n = len(entries)
    by = {s: sum(e["status"] == s for e in entries) for s in ("killed", "survived", "timeout", "baseline-failed")}
    explained = sum(e["status"] == "survived" and bool(e.get("survives_because")) for e in entries)
    return (f"mutation run: {by['killed']} killed of {n}; {by['survived']} survived ({explained} explained), "
            f"{by['timeout']} timed out, {by['baseline-failed']} with a failing baseline")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated mutant ids (their entries in --out are replaced)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the record (default {OUT.relative_to(ROOT)})")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds for one selection (default %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies (for debugging)")
    args = parser.parse_args(argv)
    check_list([*MUTATIONS, ISOLATION])
    chosen = MUTATIONS
    if args.only:
        ids = [i.strip() for i in args.only.split(",") if i.strip()]
        unknown = sorted(set(ids) - {m.id for m in MUTATIONS})
        if unknown:
            parser.error(f"--only: unknown mutant(s) {', '.join(unknown)} (see --list)")
        chosen = [m for m in MUTATIONS if m.id in ids]
    if args.list:
        for m in chosen:
            print(f"{m.id}  ({m.file})\n    {m.description}\n    tests: {' '.join(m.selection)}"
                  + (f"\n    survives because: {m.survives_because}" if m.survives_because else ""))
        return 0
    if not SHARED.is_dir():
        sys.exit(f"mutations.py: {SHARED} is missing (the tests need ../shared, or ELMO_SHARED)")

    # Every copy is made from one snapshot of the working tree, taken now: an edit made in the
    # checkout while the run goes on (someone else at work there) cannot reach half the mutants.
    snapshot = scratch_copy(prefix="torchelmo-snapshot-")
    try:
        return _run(args, chosen, snapshot)
    finally:
        if not args.keep:
            shutil.rmtree(snapshot, ignore_errors=True)


def _run(args, chosen: list[Mutation], snapshot: Path) -> int:
    # 1. The isolation check, then every selection's baseline once on the unmutated copy.
    check_list([*MUTATIONS, ISOLATION], snapshot)
    iso = isolation_check(snapshot, args.timeout, args.keep)
    print(f"isolation check (a syntax error in the copy's {ISOLATION.file}): {iso['status']}, "
          f"the error names {iso['syntax_error_in']}", flush=True)
    if iso["status"] != "killed":
        sys.exit("mutations.py: the tests did not import the scratch copy's code; no result would mean anything")
    baselines: dict[tuple[str, ...], dict] = {}
    copy = scratch_copy(snapshot)
    try:
        for m in chosen:
            if m.selection not in baselines:
                r = run_selection(m.selection, copy, args.timeout)
                baselines[m.selection] = r
                ok = "passes" if r["rc"] == 0 else f"FAILS ({r['first_failure'] or r['rc']})"
                print(f"baseline {ok} in {r['seconds']:.0f}s [{r['tally']}]: {' '.join(m.selection)}", flush=True)
                if r["rc"] == 0 and "skipped" in r["tally"]:
                    print("  note: the baseline skips tests; a mutant that only they would catch survives",
                          flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(copy, ignore_errors=True)

    # 2. The mutants.
    entries = []
    for i, m in enumerate(chosen, 1):
        e = run_mutant(m, snapshot, args.timeout, baselines[m.selection], args.keep)
        e["baseline"] = {"seconds": baselines[m.selection]["seconds"], "tally": baselines[m.selection]["tally"]}
        entries.append(e)
        print(f"[{i}/{len(chosen)}] {m.id}: {e['status']} in {e['seconds']:.0f}s"
              + (f" ({e['first_failure']})" if e.get("first_failure") else ""), flush=True)

    # 3. The record: replace these entries, keep the others (a run with --only updates the record).
    record = {"mutants": []}
    if args.out.is_file():
        try:
            record = json.loads(args.out.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            pass
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    for e in entries:
        e["run_at"] = now
    fresh = {e["id"]: e for e in entries}
    old = {e["id"]: e for e in record.get("mutants", []) if e["id"] in {m.id for m in MUTATIONS}}
    merged = [fresh.get(m.id) or old.get(m.id) for m in MUTATIONS]
    merged = [e for e in merged if e is not None]
    record = {
        "what": "mutation run over the code behind docs/reliability.md (scripts/mutations.py)",
        "command": "OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python scripts/mutations.py",
        "versions": versions(),
        "isolation_check": iso,
        "summary": summary(merged),
        "mutants": merged,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, args.out)
    print()
    print(table(entries))
    print()
    print(summary(entries) + (f"  (record: {summary(merged)})" if len(merged) != len(entries) else ""))
    unexplained = [e["id"] for e in entries if e["status"] == "survived" and not e.get("survives_because")]
    return 1 if unexplained or any(e["status"] == "baseline-failed" for e in entries) else 0


if __name__ == "__main__":
    sys.exit(main())
