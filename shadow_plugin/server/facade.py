"""The one door from the HTTP routes to the reader: every method takes the service's lock (the
host interface's, which the idle loop takes for each chunk it reads), so no route touches the
reader beside the idle thread. Existence checks look at a session's position (Reader.position)
and restore nothing; a route that reads takes the lock one chunk at a time where it can
(`catch_up`), so a host's call waits at most one chunk; a question's own ids are then read in
grid pieces and a summary decodes in small bursts, one per hold (`ask`, `summarize`). The
question calls are below; waiting asks wait in the event loop (waits.py), holding nothing.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import xxhash

from block_store import ExactnessError
from shadow_plugin import validate
from shadow_plugin.reader.conflicts import PositionMismatch, StaleSession
from shadow_plugin.reader.reader import FeedResult
from shadow_plugin.scheduling.host import Host
from shadow_plugin.server.errors import CatchUpTooLong, ClientGone, NotDurable, QuestionTooLong
from shadow_plugin.server.narrator import Narrator
from shadow_plugin.server.router_journal import Profile, RouterJournal, insertion_point

ASK_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, float("inf"))


def ids_digest(ids) -> str:
    """xxh3-64 hex of the ids as int64 little-endian bytes."""
    return xxhash.xxh3_64(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()

def _check_cancel(cancelled: threading.Event | None) -> None:
    if cancelled is not None and cancelled.is_set():
        raise ClientGone()


def narration_status(narrator: Narrator, journal: RouterJournal) -> dict:
    """The router journal's agreement and the narrator's last three narrations a session (call
    under the lock once the idle loop runs)."""
    return {"router_agreement": {"agree": journal.agree, "total": journal.total},
            "narrations": {s: list(v)[-3:] for s, v in narrator.narrations.items()},
            "narrator_jobs_pending": len(narrator.jobs)}


def _listed(names: list[str], most: int = 5) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def not_read_why(session: str | None, num_chunks: int, turns: list[str], busy: bool,
                 ahead: dict[str, int], chunk_ms: float | None) -> str:
    """The reason a 504 gives (Shadow.not_reading_why): session (None: the idle window in
    general) with num_chunks whole chunks unread; the open turns' sessions; the host's busy
    signal; the sessions the idle window reads first, with their whole chunks of backlog
    (Scheduler.ahead_of); the reader's mean ms a chunk (None: none read yet)."""
    others = [t for t in turns if t != session]
    if session is not None and session in turns:
        why = (f"its own turn is open (POST /v1/shadow/sessions/{session}/end ends it): in a "
               f"turn it is read only in the ration between the host's rounds, and the idle "
               f"window reads after every open turn has ended")
        return why + (f"; other open turns: {_listed(others)}" if others else "")
    if turns:
        return (f"the idle window waits for other sessions' open turns to end (POST "
                f".../end): {_listed(others)}")
    if busy:
        return "the host reports busy (POST /v1/shadow/host {\"busy\": false} to free it)"
    if session is None:
        return "the reader is reading other sessions or the backlog is large"
    cost = "" if chunk_ms is None else \
        f" (about {num_chunks * chunk_ms / 1e3:.1f} s at the reader's {chunk_ms:.0f} ms a chunk)"
    if not ahead:
        return f"the idle window is reading it: {num_chunks} chunks were left{cost}"
    return (f"the idle window reads {len(ahead)} other sessions first ({_listed(list(ahead))}: "
            f"{sum(ahead.values())} chunks), then its {num_chunks} chunks{cost}")


@dataclass(frozen=True)
class Fed:
    """A feed's result and the session's position after it (ids held, C)."""

    result: FeedResult
    num_ids: int
    committed: int


class Shadow:
    """Args: host (the in-process host interface over the reader: its lock is the one lock);
    journal, narrator: the service's router journal and narrator; profiles: name -> Profile;
    max_catchup_tokens: the most ids a question may read before its forward (None: no bound;
    CatchUpTooLong past it); positions_policy: past the model's positions, "refuse" a turn or
    output (ValueError) or "cap" it (the session holds the first ids that fit);
    max_question_tokens: the most ids a question or a summary's instruction may render to
    (QuestionTooLong, 413, past it); max_summary_tokens: the most tokens a summary may ask
    for (ValueError, 400, past it); decode_burst_tokens: the most tokens a summary decodes
    per hold of the gate (fewer when one chunk's time holds fewer, `_burst_tokens`)."""

    def __init__(self, host: Host, journal: RouterJournal, narrator: Narrator,
                 profiles: dict[str, Profile], max_catchup_tokens: int | None = None,
                 positions_policy: str = "refuse", max_question_tokens: int = 32_768,
                 max_summary_tokens: int = 4096, decode_burst_tokens: int = 8,
                 max_questions: int = 8):
        self.host, self.reader = host, host.reader
        self.max_catchup_tokens, self.positions_policy = max_catchup_tokens, positions_policy
        self.max_question_tokens, self.max_summary_tokens = max_question_tokens, max_summary_tokens
        self.decode_burst_tokens, self.max_questions = decode_burst_tokens, max_questions
        self.max_positions = self.reader.adapter.max_positions
        self.journal, self.narrator, self.profiles = journal, narrator, profiles
        self.grid = self.reader.config.grid
        self.session_profiles: dict[str, Profile] = {}
        self.unfollowed: set[str] = set()               # turned with a profile that is off
        self.answers: deque = deque(maxlen=20)          # the last answers, for status
        self.last_answer: dict[str, dict] = {}          # each session's last answer
        self._num_waiting = 0                           # host calls waiting for the lock
        self._waiting_lock = threading.Lock()
        self.ask_ms: deque = deque(maxlen=10_000)       # for the latency histogram
        self.slot_lock_wait_ms = 0.0     # what the ration slices waited for the lock (ms, summed)

    @property
    def lock(self):
        """The one lock: the host interface's (read at each use, so it can be instrumented)."""
        return self.host.lock

    @contextlib.contextmanager
    def _held(self):
        """The lock for a host's call or a report, counted while it waits, so a question's
        steps let it in first (`_let_waiters_in`)."""
        with self._waiting_lock:
            self._num_waiting += 1
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(self.lock)
            finally:
                with self._waiting_lock:
                    self._num_waiting -= 1
            yield

    def _let_waiters_in(self, max_wait_s: float = 0.05) -> None:
        """Between two holds of the gate by one question or summary: the host's calls waiting
        for the lock take it first (at most max_wait_s). Python's locks are not fair: a thread
        that lets go and takes the lock again at once kept a waiting `turn` out for a whole
        summary (1.6 s, with chunks of 27 ms, tests/integration/test_service_stall.py)."""
        deadline = time.monotonic() + max_wait_s
        while self._num_waiting and time.monotonic() < deadline:
            time.sleep(0.0002)

    def gate(self):
        """The hold for a question's heavy work (catch_up's chunks, its forward, a decode, a
        check): the one lock; inside an engine, the lock between its steps only (the embedded
        shadow sets its turnstile.Turnstile here)."""
        return self.lock

    def _position(self, session: str) -> tuple[int, int]:
        """(ids held, C) without restoring; KeyError (404) for an unknown session."""
        return self.reader.position(session)

    def _fit(self, session: str, ids: list[int], start: int) -> list[int]:
        """`ids` after `start` ids held, within the model's positions: all, or (policy "cap")
        the first that fit. ValueError past them with the policy "refuse"."""
        room = self.max_positions - start
        if len(ids) <= room:
            return ids
        if self.positions_policy == "cap":
            return ids[:max(room, 0)]
        raise ValueError(f"session {session!r}: {start + len(ids)} ids would pass the model's "
                         f"{self.max_positions} positions (SHADOW_MAX_POSITIONS_POLICY=refuse; "
                         f"cap holds the first {self.max_positions})")

    def _fed(self, session: str, result: FeedResult) -> Fed:
        return Fed(result, *self._position(session))

    # -- host events ---------------------------------------------------------------------------
    def prefetch(self, session: str, ids, before_read=None) -> int:
        """Reader.prefetch without the lock: a parked session's page files (or a new
        session's prefix on disk) read ahead of its turn, so the restore under the lock only
        copies (`before_read()` is called before the first file is read); 0 for a session
        name that is not valid (its turn refuses it) or nothing to read."""
        try:
            return self.reader.prefetch(session, ids, before_read)
        except ValueError:
            return 0

    def turn(self, session: str, ids: list[int], profile: str | None,
             router_label: str | None, require_durable: bool = True,
             read_ahead: bool = True) -> Fed | None:
        """A new turn under its profile: None when the profile's mode is off (not followed);
        registers the router question at the insertion point when the profile asks for it.
        Raises ValueError for an unknown profile or bad ids (nothing changes), NotDurable when
        the disk refused the session's manifest (the turn is held in memory: resending it
        changes nothing but the manifest). read_ahead: a parked session's page files are read
        before the lock is taken (prefetch); off for a caller that holds the lock already."""
        if profile is not None and profile not in self.profiles:
            raise ValueError(f"unknown profile {profile!r}")
        prof = self.profiles.get(profile, Profile())
        validate.token_ids(ids, self.reader.adapter.vocab_size, "prompt_ids")
        if not prof.mode:                    # not followed: what was held no longer holds
            with self._held():
                if self.reader.knows(session):
                    self.host.forget(session)
                    self.last_answer.pop(session, None)
                self.unfollowed.add(session)
            return None
        if read_ahead:       # a parked session's pages, without the lock (off for a caller
            self.prefetch(session, ids)      # that holds it: the reads would happen under it)
        with self._held():
            self.reader.sync(session)           # another server's newer manifest (shared)
            try:
                n, c = self._position(session)
                backlog = n - c                 # as the turn began (the router journal's)
            except KeyError:
                backlog = 0
            ids = self._fit(session, ids, 0)
            result = self.host.turn_started(session, ids, profile, router_label)
            self.session_profiles[session] = prof
            self.unfollowed.discard(session)
            self.narrator.turn_started(session)
            if prof.router and len(ids) >= prof.router_min_tokens:
                at = insertion_point(ids)
                self.journal.expect(session, at, router_label, backlog)
                self.host.question_at(session, at)
            if result.durable is False and require_durable:
                raise NotDurable(session, "the turn is held in memory")
            return self._fed(session, result)

    def output(self, session: str, ids: list[int], position: int | None = None,
               require_durable: bool = True) -> Fed | None:
        """Ids the host produced (after `position` ids, when given); queues a narration at each
        </think> when the profile asks. Raises PositionMismatch when the session holds another
        number of ids, StaleSession when it came back stale from a restart or another server
        on a shared folder took the session on since this one held it, NotDurable when
        the manifest marking outputs could not be written (nothing is appended then; not with
        require_durable False: an engine's own events, which no host retries)."""
        validate.token_ids(ids, self.reader.adapter.vocab_size, "ids")
        with self._held():
            if session in self.unfollowed and not self.reader.knows(session):
                return None                  # its turn's profile has the shadow off
            moved = self.reader.sync(session)   # another server took its turn (shared)
            start = self._position(session)[0]
            if moved:
                raise StaleSession(session, start)
            if self.reader.stale(session):
                raise StaleSession(session, start)
            capped = self.positions_policy == "cap" and start >= self.max_positions
            if position is not None and position != start and not (capped and position > start):
                raise PositionMismatch(session, position, start)
            ids = self._fit(session, ids, start)
            if ids and self.reader.mark_outputs(session) is False and require_durable:
                raise NotDurable(session, "the outputs were not appended")
            result = self.host.output(session, ids)
            if self.session_profiles.get(session, Profile()).narrator:
                self.narrator.on_output(session, start, list(ids))
            return self._fed(session, result)

    def between_rounds(self, session: str):
        """The ration slice (host.Slice), then one narration if the narrator's share covers
        its cost."""
        t0 = time.perf_counter()
        with self._held():
            self.slot_lock_wait_ms += (time.perf_counter() - t0) * 1e3
            self._position(session)
            sl = self.host.between_rounds(session)
            turn = self.host.scheduler.turns.get(session)
            first = turn.first_token_s if turn else None
            budget = self.narrator.budget_ms(session, first, self.host.scheduler.clock())
            if budget >= self.narrator.estimate_ms():
                self.narrator.run_one(self.reader, session)
            return sl

    def end(self, session: str, require_durable: bool = True) -> bool:
        """The turn ended (the session stays); False for a session not followed (its turn's
        profile has the shadow off). Raises NotDurable when the reader has a disk and the
        manifest holding all the session's ids could not be written."""
        with self._held():
            if session in self.unfollowed and not self.reader.knows(session):
                return False
            self._position(session)
            saved = self.host.turn_finished(session)
            if not saved and self.reader.has_disk and require_durable:
                raise NotDurable(session, "the turn's end is held in memory")
            return True

    def delete(self, session: str) -> None:
        """Forget the session in the reader and the scheduler, its file included."""
        with self._held():
            try:
                self._position(session)
            except KeyError:                 # listed as refused at start-up, or not followed
                if self.reader.refused(session) is None and session not in self.unfollowed:
                    raise
            self.host.forget(session)
            self.last_answer.pop(session, None)
            self.unfollowed.discard(session)

    def narration(self, session: str) -> dict:
        with self._held():
            self._position(session)
            return {"session": session,
                    "narrations": list(self.narrator.narrations.get(session, [])),
                    "pending": sum(1 for s, _ in self.narrator.jobs if s == session)}

    def sessions(self) -> dict:
        """Every session held: ids, C, backlog, residency, bytes (Reader.stats's), restoring
        nothing."""
        with self._held():
            return {"sessions": self.reader.stats()["sessions"]}

    # -- reporting -----------------------------------------------------------------------------
    def stats(self) -> dict:
        """Reader.stats (each session with its last answer) and totals, the open turns and why
        the idle window reads nothing now (`reading_stalled`, Scheduler.stalled: a backlog
        that does not move while a turn is open and no round comes), the host
        share (ration_ms, host_decode_ms), the forwards' CUDA graphs (`graphs`:
        Adapter.graph_stats), the last answers, the router journal's agreement and
        the narrator's latest narrations, in one hold (the idle loop's narrator writes them
        under the lock)."""
        with self._held():
            ration_ms, decode_ms = self.host.scheduler.host_share()
            stats = self.reader.stats()
            for sid, s in stats["sessions"].items():
                s["last_answer"] = self.last_answer.get(sid)
            return {**stats, "totals": dict(self.reader.totals),
                    "open_turns": sorted(self.host.scheduler.turns),
                    "reading_stalled": self.host.scheduler.stalled(),
                    "ration_ms": ration_ms, "host_decode_ms": decode_ms,
                    "chunks_by_window": dict(self.host.num_chunks),
                    "graphs": self.reader.adapter.graph_stats(),
                    "last_answers": list(self.answers),
                    **narration_status(self.narrator, self.journal)}

    def metrics(self) -> dict:
        """stats() and the questions' latency histogram (question_ms: cumulative counts at
        ASK_BUCKETS_MS, and their sum): what server.metrics.Collector reports."""
        with self._held():
            ms = list(self.ask_ms)
        return {**self.stats(), "question_ms": {
            "buckets": [[b, sum(x <= b for x in ms)] for b in ASK_BUCKETS_MS],
            "sum": sum(ms)}}

    def fork_position(self, session: str, at: int | None) -> int:
        """The position a question or summary forks at: `at`, or all the session's ids. KeyError
        (404) for an unknown session, ValueError (400) for an `at` that is not an integer in
        [0, its ids] (validate.position), before anything is read for it. With a shared
        folder a copy older than the folder's manifest (another server took the session's
        last turn) is given up first, so the question reads the newest ids (Reader.sync)."""
        with self._held():
            self.reader.sync(session)
            n = self._position(session)[0]
        return validate.position(at, n)

    def position(self, session: str) -> tuple[int, int]:
        """(ids held, C) under the lock, restoring nothing; KeyError for an unknown session."""
        with self._held():
            return self._position(session)

    def positions(self, sessions: list[str]) -> dict[str, list[int] | None]:
        """{session: [ids held, C], or None when unknown} in one hold of the lock (what the
        waiting asks look at, server.waits.Waits)."""
        out: dict[str, list[int] | None] = {}
        with self._held():
            for s in sessions:
                try:
                    out[s] = list(self._position(s))
                except (KeyError, ValueError):
                    out[s] = None
        return out

    def holds(self, sessions: list[str]) -> dict[str, dict | None]:
        """{session: {num_ids, committed, resident, version}, or None when unknown} in one
        hold of the lock, restoring nothing (Reader.holding): what a door over several
        shadows on one folder compares to find the one holding a session's newest state
        (server.ranks)."""
        out: dict[str, dict | None] = {}
        with self._held():
            for s in sessions:
                try:
                    n, c, resident, version = self.reader.holding(s)
                except (KeyError, ValueError):
                    out[s] = None
                    continue
                out[s] = {"num_ids": n, "committed": c, "resident": resident,
                          "version": version}
        return out

    def not_reading_why(self, session: str | None = None) -> str:
        """Why the reader has not read `session`'s backlog (for a 504; without a session, why
        the idle window reads nothing): its own turn open, other sessions' open turns, the
        host's busy signal, or the idle window reading other sessions first (`not_read_why`)."""
        with self._held():
            sched = self.host.scheduler
            turns, busy = sorted(sched.turns), sched.host_busy()
            try:
                n, c = self._position(session) if session is not None else (0, 0)
            except KeyError:
                session, n, c = None, 0, 0
            ahead = {}
            if session is not None and not turns and not busy:
                for s in sched.ahead_of(session):
                    try:
                        num, com = self._position(s)
                    except KeyError:             # gone meanwhile
                        continue
                    ahead[s] = (num - com) // self.grid
            totals = self.reader.totals
            chunk_ms = totals["read_ms"] / totals["num_chunks"] if totals["num_chunks"] else None
        return not_read_why(session, (n - c) // self.grid, turns, busy, ahead, chunk_ms)

    # -- questions -----------------------------------------------------------------------------
    def catch_up_tokens(self, session: str, at: int) -> int:
        """Ids a question at `at` must read first: up to the grid line at or below `at`, from
        C (at or above it) or from the newest checkpoint at or below `at` (below C). KeyError
        for an unknown session."""
        with self._held():
            n, c = self._position(session)
            line = at // self.grid * self.grid
            if at >= c:
                return max(line - c, 0)
            below = [p for p in self.reader.checkpoint_positions(session) if p <= at]
            return line - max(below, default=0)

    def catch_up(self, session: str, at: int, cancelled: threading.Event | None = None) -> int:
        """Read the chunks a question or fork at `at` needs one at a time, taking the lock for
        each, so a host's call waits at most one chunk (the ask itself would read them all
        under one hold): at or above C, commit up to the grid line at or below `at`; below C,
        re-read in scratch from the newest checkpoint (Reader.prepare_fork). Returns the
        chunks read. Raises CatchUpTooLong (nothing read) past max_catchup_tokens, ClientGone
        between two chunks once `cancelled` is set (what was committed stays)."""
        need = self.catch_up_tokens(session, at)
        if self.max_catchup_tokens is not None and need > self.max_catchup_tokens:
            n, c = self.position(session)
            raise CatchUpTooLong(session, need, self.max_catchup_tokens, n - c, c)
        line, done = at // self.grid * self.grid, 0
        for _ in range(2 * line // self.grid + 2):   # bounded: another call may restart it
            _check_cancel(cancelled)
            self._let_waiters_in()
            with self.gate():
                r = self.reader
                try:
                    n, c = self._position(session)
                except KeyError:
                    return done
                if at < c:
                    k = r.prepare_fork(session, at, 1)
                elif c < line and n - c >= self.grid:
                    k = r.read(session, max_chunks=1).num_chunks
                else:
                    k = 0
                if k == 0:
                    return done
                done += k
        return done

    def ask(self, session: str, question, choices, at: int | None, fork_at: int | None,
            cancelled: threading.Event | None = None):
        """Reader.ask, a step per hold of the gate: after catch_up read toward `fork_at`
        (fork_position's answer; None: fork_position's answer now, with its errors, so a
        remote door need not ask for it in a call of its own) chunk by chunk, the question is
        begun (rendered), its ids read in grid pieces and
        answered (Reader.begin_ask, advance, finish_ask), so a host's call waits at most one
        chunk; the answer is kept for status and the latency histogram. The question is
        rendered and checked before anything is read: ValueError (400) as Reader.ask, and
        QuestionTooLong past max_question_tokens, read nothing and hold nothing. Raises as
        catch_up, and ClientGone between two steps once `cancelled` is set (the fork's pages
        given back)."""
        if fork_at is None:
            fork_at = self.fork_position(session, at)
        with self._held():                 # a refused question reads nothing: checked first
            self._fits(session, [self.reader.render_question(session, question, choices, at)])
        self.catch_up(session, fork_at, cancelled)
        _check_cancel(cancelled)
        pending = self._begin(session, lambda: self.reader.begin_ask(session, question,
                                                                    choices, at))
        try:
            self._advance(pending, cancelled)
            with self.gate():
                ans = self.reader.finish_ask(pending)
                self._record(session, ans)
                return ans
        finally:
            with self.gate():
                self.reader.cancel(pending)

    def _fits(self, session: str, rendered: list[list[int]]) -> None:
        """QuestionTooLong for a rendered question (or a summary's instruction) past
        max_question_tokens."""
        longest = max(len(q) for q in rendered)
        if longest > self.max_question_tokens:
            raise QuestionTooLong(session, longest, self.max_question_tokens)

    def _record(self, session: str, ans) -> None:
        """An answer kept for status and the latency histogram (under the gate)."""
        self.ask_ms.append(ans.ms)
        line = {"session": session, "label": ans.label, "p": max(ans.probs),
                "ms": round(ans.ms, 2), "at": ans.at, "time": time.time()}
        self.answers.append(line)
        self.last_answer[session] = line

    def ask_many(self, session: str, items, at: int | None, fork_at: int | None,
                 cancelled: threading.Event | None = None):
        """Several questions about one session (items: (question, choices) pairs, answered in
        order) in one forward: Reader.ask_many, held the way `ask` holds the gate (after
        catch_up, one batched grid piece of the questions a hold, then their last forwards in
        one (one bucket, or a mixed batch of several), or one bucket's batch or one question a
        hold where no batch takes them all), so a
        host's call waits at most one batched piece. Each answer equals the same question asked
        alone, bit for bit. Raises ValueError (400) for no question, more than max_questions
        or a bad item (as Reader.ask_many), QuestionTooLong for a question past
        max_question_tokens, all before anything is read; as `ask` otherwise."""
        if fork_at is None:                      # as in `ask` (its 404 before the 400s below)
            fork_at = self.fork_position(session, at)
        items = list(items)
        if not items:
            raise ValueError("questions: give at least one question")
        if len(items) > self.max_questions:
            raise ValueError(f"{len(items)} questions in one ask, over the limit of "
                             f"{self.max_questions} (SHADOW_MAX_QUESTIONS)")
        with self._held():                 # a refused question reads nothing: checked first
            self._fits(session, self.reader.render_questions(session, items, at))
        self.catch_up(session, fork_at, cancelled)
        _check_cancel(cancelled)
        with self.gate():
            pendings = self.reader.begin_ask_many(session, items, at)
            longest = max(p.num_extra_ids for p in pendings)
            if longest > self.max_question_tokens:
                self.reader.cancel_many(pendings)
                raise QuestionTooLong(session, longest, self.max_question_tokens)
        try:
            while True:
                _check_cancel(cancelled)
                self._let_waiters_in()
                with self.gate():
                    if not self.reader.advance_many(pendings):
                        break
            with self.gate():
                answers = self.reader.finish_ask_many(pendings)
                for ans in answers:
                    self._record(session, ans)
                return answers
        finally:
            with self.gate():
                self.reader.cancel_many(pendings)

    def _begin(self, session: str, begin):
        """begin() under the gate (Reader.begin_ask or begin_generate: the fork of a question
        or a summary's instruction, nothing read yet); QuestionTooLong past
        max_question_tokens, the fork's pages given back."""
        with self.gate():
            pending = begin()
            if pending.num_extra_ids > self.max_question_tokens:
                self.reader.cancel(pending)
                raise QuestionTooLong(session, pending.num_extra_ids, self.max_question_tokens)
        return pending

    def _advance(self, pending, cancelled: threading.Event | None) -> None:
        """Reader.advance, one step (a grid piece, a burst of decode_burst_tokens) per hold
        of the gate, until only the finish is left; ClientGone once `cancelled` is set."""
        while True:
            _check_cancel(cancelled)
            self._let_waiters_in()
            with self.gate():
                if not self.reader.advance(pending, self._burst_tokens(pending)):
                    return

    def _burst_tokens(self, pending) -> int:
        """Tokens for a decode's next burst: as many as fit in the reader's mean chunk time
        (Reader.totals), by the decode's own mean token time so far, 1 to
        decode_burst_tokens (1 until both are known)."""
        dec, totals = pending.decoding, self.reader.totals
        if dec is None or not dec.num_steps or not totals["num_chunks"]:
            return 1
        chunk_ms = totals["read_ms"] / totals["num_chunks"]
        token_ms = max(dec.decode_ms / dec.num_steps, 1e-3)
        return max(1, min(self.decode_burst_tokens, int(chunk_ms // token_ms)))

    def summarize(self, session: str, instruction: str, max_tokens: int, at: int | None,
                  cancelled: threading.Event | None = None):
        """Reader.summarize, a step per hold of the gate (after catch_up): the instruction's
        ids in grid pieces, then the decode in bursts of decode_burst_tokens, so a host's call
        waits at most about one chunk (a burst is sized to one chunk's time). Raises
        ValueError (400) for max_tokens past max_summary_tokens or a bad instruction,
        QuestionTooLong for an instruction past max_question_tokens (these before anything is
        read), as catch_up, and ClientGone between two steps once `cancelled` is set."""
        if max_tokens > self.max_summary_tokens:
            raise ValueError(f"max_tokens = {max_tokens} is over the summary limit of "
                             f"{self.max_summary_tokens} tokens (SHADOW_MAX_SUMMARY_TOKENS)")
        fork_at = self.fork_position(session, at)
        with self._held():                 # a refused instruction reads nothing
            self._fits(session, [self.reader.render_prompt(session, instruction, at)])
        self.catch_up(session, fork_at, cancelled)
        _check_cancel(cancelled)
        pending = self._begin(session, lambda: self.reader.begin_generate(
            session, instruction, max_tokens, at))
        try:
            self._advance(pending, cancelled)
            with self.gate():
                gen = self.reader.finish_generate(pending)
                return self.reader.summary_text(gen), gen
        finally:
            with self.gate():
                self.reader.cancel(pending)

    def check_exact(self, session: str) -> bool:
        """Reader.check_exact under the lock, in one hold (raises ExactnessError naming what
        differs); `check` lets the lock go between its chunks."""
        with self._held():
            return self.reader.check_exact(session)

    def check(self, session: str, cancelled: threading.Event | None = None) -> dict:
        """check_exact as a report: {session, num_ids, committed, exact, error, ids_xxh3 (the
        xxh3-64 hex of the ids as int64 little-endian bytes, for a host to compare with what
        it served), moved}, of the session as it was when the check began: its state is held
        in a snapshot (Reader.begin_check) and the fresh prefill read one chunk per hold of
        the gate, so a host's call waits at most about one chunk; `moved` says whether the
        session's ids or C changed (or it went) while the check ran. KeyError for an unknown
        session; ClientGone between two chunks once `cancelled` is set (nothing held
        stays)."""
        with self.gate():
            chk = self.reader.begin_check(session)
            digest = ids_digest(self.reader.ids(session))
        try:
            while True:
                _check_cancel(cancelled)
                self._let_waiters_in()
                with self.gate():
                    if not self.reader.advance_check(chk):
                        break
            with self.gate():
                try:
                    exact, error = self.reader.finish_check(chk), None
                except ExactnessError as e:
                    exact, error = False, str(e)
                try:               # ids rewritten to the same length and read back count
                    moved = self._position(session) != (chk.num_ids, chk.committed) or \
                        ids_digest(self.reader.ids(session)) != digest
                except KeyError:
                    moved = True
        finally:
            with self.gate():
                self.reader.cancel_check(chk)
        return {"session": session, "num_ids": chk.num_ids, "committed": chk.committed,
                "exact": exact, "error": error, "ids_xxh3": digest, "moved": moved}
