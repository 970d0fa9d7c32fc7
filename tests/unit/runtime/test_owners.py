from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import pytest

from graphflow.kv.manager import KVStateManager
from graphflow.runtime import owners
from graphflow.runtime.kept import KeptStates
from graphflow.runtime.owners import end_gone_owners, gone_jobs, watch_owners


class _Replica:
    """The two calls ``end_gone_owners`` makes, over a real ``KeptStates``."""

    def __init__(self) -> None:
        self.held = KeptStates("score", clock=lambda: 0.0)

    def run_owners(self) -> set[str]:
        return self.held.run_owners()

    def end_runs_of(self, gone: Iterable[str]) -> list[str]:
        return self.held.end_runs_of(gone)


def test_a_gone_clients_runs_stop_protecting_their_states() -> None:
    held = KeptStates("score", clock=lambda: 0.0)
    for sid in ("a:ROOT", "b:ROOT", "c:ROOT"):
        held.add(sid)
    held.note_next_use("run-a", (("a:ROOT", 0),), owner="job-a")
    held.note_next_use("run-b", (("b:ROOT", 0),), owner="job-b")
    held.note_next_use("run-c", (("c:ROOT", 0),))  # no owner: never ended this way
    assert held.run_owners() == {"job-a", "job-b"}
    assert held.end_runs_of({"job-a", "job-x", ""}) == ["run-a"]
    assert held.needed_now() == {"b:ROOT", "c:ROOT"}
    assert held.run_owners() == {"job-b"}
    held.note_next_use("run-b", ())  # its own end_run forgets the owner too
    assert held.run_owners() == set() and held.needed_now() == {"c:ROOT"}


def test_a_plan_that_arrives_after_its_run_ended_protects_nothing(monkeypatch) -> None:
    from graphflow.runtime import kept

    held = KeptStates("score", clock=lambda: 0.0)
    held.add("a:ROOT")
    held.note_next_use("run-a", (("a:ROOT", 1),), owner="job-a")
    held.end_run("run-a")
    held.note_next_use("run-a", (("a:ROOT", 0),), owner="job-a")  # NOTE: queued behind others; its run failed
    assert held.needed_now() == set() and held.run_owners() == set()
    held.note_next_use("run-b", (("a:ROOT", 0),), owner="job-b")  # another run still protects
    assert held.end_runs_of({"job-b"}) == ["run-b"]
    held.note_next_use("run-b", (("a:ROOT", 0),), owner="job-b")  # a gone client's late plan too
    assert held.needed_now() == set()
    monkeypatch.setattr(kept, "ENDED_RUNS_KEPT", 3)
    for i in range(5):
        held.end_run(f"run-{i}")
    assert list(held._ended) == ["run-2", "run-3", "run-4"]  # bounded: the latest ended runs


def test_the_lookup_is_asked_only_about_recorded_clients() -> None:
    replica, asked = _Replica(), []

    def gone(jobs: set[str]) -> set[str]:
        asked.append(jobs)
        return {"job-a"}

    assert end_gone_owners(replica, gone) == [] and asked == []  # no run: no lookup
    replica.held.add("a:ROOT")
    replica.held.note_next_use("run-a", (("a:ROOT", 0),), owner="job-a")
    replica.held.note_next_use("run-a2", (("a:ROOT", 1),), owner="job-a")
    replica.held.note_next_use("run-b", (("a:ROOT", 2),), owner="job-b")
    assert end_gone_owners(replica, gone) == ["run-a", "run-a2"]
    assert asked == [{"job-a", "job-b"}] and replica.run_owners() == {"job-b"}


@dataclass
class _Info:
    is_dead: bool


class _JobId:
    def __init__(self, hex_id: str) -> None:
        self._hex = hex_id

    def hex(self) -> str:
        return self._hex


class _Gcs:
    """Answers ``get_all_job_info`` as Ray's GCS client does: job id → job table entry, only
    the jobs matching the id asked about (none for an id it does not know)."""

    def __init__(self, dead: dict[str, bool]) -> None:
        self.dead, self.asked = dead, []

    def get_all_job_info(self, **kw: object) -> dict[_JobId, _Info]:
        assert kw["skip_submission_job_info_field"] and kw["skip_is_running_tasks_field"]
        job = str(kw["job_or_submission_id"])
        self.asked.append(job)
        return {_JobId(job): _Info(self.dead[job])} if job in self.dead else {}


def test_gone_jobs_are_those_the_job_table_marks_dead() -> None:
    gcs = _Gcs({"01000000": True, "02000000": False})
    assert gone_jobs(gcs, {"01000000", "02000000", "09000000"}) == {"01000000"}  # unknown: alive
    assert sorted(gcs.asked) == ["01000000", "02000000", "09000000"]


def test_the_watch_ends_gone_clients_runs_and_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(owners, "OWNER_CHECK_S", 0.01)
    replica, stop, asked = _Replica(), threading.Event(), threading.Event()
    replica.held.add("a:ROOT")
    replica.held.note_next_use("run-a", (("a:ROOT", 0),), owner="job-a")

    def gone(jobs: set[str]) -> set[str]:
        asked.set()
        return jobs

    thread = watch_owners(replica, gone, stop)
    assert asked.wait(5.0)
    for _ in range(500):
        if not replica.held.needed_now():
            break
        time.sleep(0.01)
    stop.set()
    thread.join(5.0)
    assert not thread.is_alive() and replica.held.needed_now() == set() and replica.run_owners() == set()


class _Manager:
    """The watch's two calls on a real ``KVStateManager``, as the manager's actor makes them."""

    def __init__(self, mgr: KVStateManager) -> None:
        self.mgr = mgr

    def run_owners(self) -> set[str]:
        return self.mgr.run_owners()

    def end_runs_of(self, gone: Iterable[str]) -> list[str]:
        return self.mgr.end_runs_of(gone, 100.0)


def test_the_manager_ends_the_runs_of_gone_clients() -> None:
    mgr = KVStateManager(retain_ended_s=0.0)
    mgr.begin_run("run-a", "job-a")
    mgr.begin_run("run-b", "job-b")
    mgr.begin_run("run-local", "")  # no client to ask about: ended only by its executor
    assert mgr.run_owners() == {"job-a", "job-b"}
    assert end_gone_owners(_Manager(mgr), lambda jobs: jobs & {"job-a"}) == ["run-a"]
    assert mgr.run_owners() == {"job-b"}
    mgr.end_run("run-b", 101.0)  # its executor ended it: nothing left to watch
    assert mgr.run_owners() == set() and end_gone_owners(_Manager(mgr), lambda jobs: jobs) == []


def test_a_failing_lookup_is_logged_once_and_keeps_the_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(owners, "OWNER_CHECK_S", 0.01)
    replica, stop, calls = _Replica(), threading.Event(), []
    replica.held.add("a:ROOT")
    replica.held.note_next_use("run-a", (("a:ROOT", 0),), owner="job-a")

    def gone(jobs: set[str]) -> set[str]:
        calls.append(jobs)
        if len(calls) >= 3:
            stop.set()
        raise ConnectionError("GCS unreachable")

    with caplog.at_level(logging.WARNING, logger="graphflow"):
        watch_owners(replica, gone, stop).join(5.0)
    assert len(calls) >= 3 and replica.held.needed_now() == {"a:ROOT"}
    assert [r.getMessage() for r in caplog.records].count(
        "cannot end the runs of clients that are gone (ConnectionError('GCS unreachable')); retrying"
    ) == 1
