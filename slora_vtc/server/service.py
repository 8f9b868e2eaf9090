"""The engine in its own thread, serving requests that HTTP handlers hand it on the event loop.

Only the engine thread touches the engine, its scheduler and its pool. Handlers send commands
through a thread-safe inbox, drained between steps (the thread sleeps on it while idle). After
every step the thread sends each request's new tokens (and, when it ends, its final state) to the
request's asyncio queue: one loop.call_soon_threadsafe per step for all requests together.

Idle clients (nothing queued or running for `client_idle_s` on the engine clock) are forgotten:
their numbers leave `stats` (the total keeps them) and the scheduler drops what it can
(Scheduler.forget; asked again after another idle period where it says some may go later). The
thread checks the oldest idle client after each round of commands and sleeps no longer than
until it is due, so expiry costs O(1) while nothing is due.
"""

import asyncio
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

from slora_vtc.engine import Engine
from slora_vtc.request import Request, State
from slora_vtc.sched.ledger import forgets
from slora_vtc.sched.shedding import queue_refuses
from slora_vtc.server.events import Accepted, Ended, Event, Subscriber, Tokens
from slora_vtc.server.stats import ServerStats, Snapshot
from slora_vtc.serving.ledger import OTHER

log = logging.getLogger(__name__)

SHUTTING_DOWN = "the server is shutting down"
QUEUE_FULL = "too many requests are waiting (--max-waiting)"
STUCK_WAIT_S = 0.05  # busy but nothing could run (cannot happen with the shared admission check): re-check this often


class ServiceStopped(RuntimeError):
    """The engine thread has stopped: nothing can be submitted any more."""


@dataclass
class _Live:
    sub: Subscriber
    sent: int = 0  # output ids already sent
    counted: int = 0  # generated tokens already in the client's stats
    last_token_at: float = 0.0  # engine clock, when the latest counted token came
    cancelled: bool = False  # aborted by the server (its client left, a shutdown), not failed by the engine


def outcome(req: Request, cancelled: bool) -> str:
    """How an ended request counts (serving/ledger.py, OUTCOMES): an abort that the server did not ask
    for (the model failed on it, the engine failed) is a failure."""
    if req.state is State.FINISHED:
        return "finished"
    if req.state is State.REJECTED:
        return "rejected"
    return "aborted" if cancelled else "failed"


def deliver(items: list[tuple[asyncio.Queue, Event]]) -> None:
    for q, event in items:
        q.put_nowait(event)


def dispatch(events: list[tuple[Subscriber, Event]]) -> None:
    """Hand events to their subscribers' loops from another thread: one call_soon_threadsafe per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = defaultdict(list)
    for sub, event in events:
        by_loop[sub.loop].append((sub.queue, event))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(deliver, items)
        except RuntimeError:
            pass  # that loop has closed: nobody is listening any more


class EngineService:
    def __init__(
        self, engine: Engine, client_idle_s: float = 600.0, max_client_labels: int = 100, max_waiting: int | None = None
    ):
        self.engine = engine
        self.max_waiting = max_waiting  # requests queued in the scheduler; None: no bound
        engine.on_end = self._on_end
        self.clock = engine.clock
        self.client_idle_s = client_idle_s
        self.stats = ServerStats(max_client_labels, self.clock.now)  # engine thread only
        self.error: str | None = None
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        # orders `closed` against puts, so no command is left unanswered; re-entrant because a
        # signal handler may call stop() while the same thread is inside _send
        self._lock = threading.RLock()
        self._closed = False
        self._live: dict[Request, _Live] = {}  # the requests in the server: submitted, not ended
        self._outbox: list[tuple[Subscriber, Event]] = []
        self._stop_at: float | None = None  # monotonic deadline of the shutdown drain
        self._thread = threading.Thread(target=self._run, name="slora-engine", daemon=True)

    # -- any thread -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def engine_pid(self) -> int | None:
        """The engine's own process where it is not the server's (None: the engine runs in this process)."""
        return None

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive() and self._stop_at is None

    def submit(self, req: Request, sub: Subscriber) -> None:
        """Queue a request; its events (Accepted or Ended first) arrive on `sub`."""
        self._send(partial(self._add, req, sub))

    def abort(self, req: Request, reason: str) -> None:
        """End a request now (no-op once it has ended); its slots are freed before the next step."""
        try:
            self._send(partial(self._abort, req, reason))
        except ServiceStopped:
            pass  # the engine thread aborted everything on its way out

    def finish(self, req: Request) -> None:
        """End a request as finished (a stop string matched its text) before its next step."""
        try:
            self._send(partial(self._finish, req))
        except ServiceStopped:
            pass

    def snapshot(self) -> Future:
        """Per-client stats with the engine's queues, counters and pool, taken between two steps."""
        try:
            return self.call(self._snapshot)
        except ServiceStopped:  # no engine thread any more: nothing changes the numbers now
            done: Future = Future()
            done.set_result(self._snapshot())
            return done

    def count_rejected(self, client: str) -> None:
        """Count a request refused before it reached the engine (the stats belong to the engine thread)."""
        self._send(partial(self._add_rejected, client))

    def wait(self) -> None:
        """Until the engine thread has ended (after a stop, or a failure)."""
        self._thread.join()

    def call(self, fn: Callable[[], object]) -> Future:
        """Run fn on the engine thread between two steps (to read engine state consistently)."""
        future: Future = Future()
        self._send(partial(self._call, fn, future))
        return future

    def stop(self, drain_s: float) -> None:
        """Begin stopping (returns at once): refuse new requests, serve the others for up to
        drain_s seconds, then abort what is left. Safe to call from a signal handler."""
        try:
            self._send(partial(self._stop, drain_s))
        except ServiceStopped:
            pass

    def shutdown(self, drain_s: float = 0.0) -> None:
        """Stop (see `stop`) and wait for the engine thread to end."""
        if self._thread.is_alive():
            self.stop(drain_s)
            self._thread.join()

    def _send(self, command: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                raise ServiceStopped(self.error or SHUTTING_DOWN)
            self._inbox.put(command)

    # -- the engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._done():
                self._take_commands(block=not self.engine.busy, timeout=self.stats.until_due(self.client_idle_s))
                if self.engine.busy and not self._step():
                    self._take_commands(block=True, timeout=STUCK_WAIT_S)
                self._flush()
                self._housekeeping()
        except Exception as e:  # a bug in the engine: end every request instead of hanging them
            log.exception("the engine thread failed")
            self.error = f"engine failed: {type(e).__name__}: {e}"
            self._abort_all(self.error)
        finally:
            self._close()

    def _done(self) -> bool:
        if self._stop_at is None:
            return False
        if self.engine.busy and time.monotonic() < self._stop_at:
            return False
        self._abort_all(SHUTTING_DOWN)
        return True

    def _take_commands(self, block: bool, timeout: float | None = None) -> None:
        if timeout == 0:
            block = False
        try:
            command = self._inbox.get(timeout=timeout) if block else self._inbox.get_nowait()
            while True:
                command()
                command = self._inbox.get_nowait()
        except queue.Empty:
            pass

    def _step(self) -> bool:
        progressed = self.engine.step()
        for req in self.engine.running:  # requests that ended this step were sent by _on_end
            self._send_tokens(req, self._live[req])
        return progressed

    def _add(self, req: Request, sub: Subscriber) -> None:
        if self._stop_at is not None or queue_refuses(self.engine.scheduler, req.client, self.max_waiting):
            req.state, req.reason = State.REJECTED, QUEUE_FULL if self._stop_at is None else self.error or SHUTTING_DOWN
            self.stats.refuse(req.client)
            self._emit(sub, Ended.of(req))
            return
        self._live[req] = _Live(sub)
        self.stats.begin(req.client)
        if self.engine.add_request(req):  # a rejection already went out through _on_end
            self.stats[req.client].admitted += 1
            self._emit(sub, Accepted())

    def _abort(self, req: Request, reason: str) -> None:
        if (live := self._live.get(req)) is not None:
            live.cancelled = True
            self.engine.abort(req, reason)

    def _finish(self, req: Request) -> None:
        if req in self._live:
            self.engine.finish(req)

    def _add_rejected(self, client: str) -> None:
        self.stats[client].rejected += 1

    def _call(self, fn: Callable[[], object], future: Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except Exception as e:
            future.set_exception(e)

    def _snapshot(self) -> Snapshot:
        """O(labelled clients + running requests): never a pass over every client."""
        self._housekeeping()  # what is due is shown gone
        engine, stats, now = self.engine, self.stats, self.clock.now()
        clients = stats.labelled()
        running: dict[str, int] = {}
        for req in engine.running:
            name = req.client if req.client in stats.labels else OTHER
            running[name] = running.get(name, 0) + 1
        waiting = {name: s.live - running.get(name, 0) for name, s in clients.items()}
        sched = engine.scheduler
        counters = {name: sched.counter_of(name) for name in stats.labels} if sched.traits.ledger else {}
        return Snapshot(
            clients=clients,
            counters=counters,
            weights={name: sched.weight_of(name) for name in counters},
            shares=stats.shares(now),
            waiting=waiting,
            running={name: running.get(name, 0) for name in clients},
            jain=stats.window.jain(),
            active_clients=stats.window.active,
            known_clients=len(stats.clients),
            forgotten_clients=stats.forgotten,
            prefix_cache=engine.memory.cache is not None,
            pool_size=engine.memory.pool.size,
            pool_used=engine.memory.pool.num_used,
            pool_cached=engine.memory.cache.evictable if engine.memory.cache else 0,
            adapters_resident=len(engine.memory.adapters),
        )

    # -- idle clients ---------------------------------------------------------------------
    def _housekeeping(self) -> None:
        self.stats.expire(self.client_idle_s, forgets(self.engine.scheduler))
        self.stats.relabel(self.clock.now())

    def _stop(self, drain_s: float) -> None:
        deadline = time.monotonic() + drain_s
        self._stop_at = deadline if self._stop_at is None else min(self._stop_at, deadline)

    def _on_end(self, req: Request) -> None:
        live = self._live.pop(req, None)
        if live is None:
            return
        self._send_tokens(req, live)
        self._end_stats(req, live)
        self._emit(live.sub, Ended.of(req))

    def _send_tokens(self, req: Request, live: _Live) -> None:
        self._account(req, live)
        if len(req.output_ids) > live.sent:
            self._emit(live.sub, Tokens(tuple(req.output_ids[live.sent :]), tuple(req.output_logprobs[live.sent :])))
            live.sent = len(req.output_ids)

    def _account(self, req: Request, live: _Live) -> None:
        """Served tokens and their latencies, once per token (engine clock)."""
        new = req.generated - live.counted
        if new <= 0:
            return
        now = self.clock.now()
        mine, total = self.stats.both(req.client)
        if live.counted == 0:
            for s in (mine, total):
                s.time_to_first_token.observe(req.first_token_time - req.arrival)
                if req.first_admitted is not None:
                    s.queue_time.observe(req.first_admitted - req.arrival)
            self.stats.served(req.client, req.prompt_len, req.cached_tokens, new, now)
            live.last_token_at = req.first_token_time
            new -= 1
        else:
            self.stats.served(req.client, 0, 0, new, now)
        for s in (mine, total):
            for _ in range(new):  # several tokens at once: the gap shared among them
                s.token_gap.observe((now - live.last_token_at) / new)
        if new:
            live.last_token_at = now
        live.counted = req.generated

    def _end_stats(self, req: Request, live: _Live) -> None:
        if req.state is State.FINISHED:
            for s in self.stats.both(req.client):
                s.stopped += req.stopped
                s.latency.observe(req.finish_time - req.arrival)
        self.stats.end(req.client, outcome(req, live.cancelled))

    def _abort_all(self, reason: str) -> None:
        """End every request: a shutdown cancels them (aborted), a failed engine fails them."""
        for req, live in list(self._live.items()):
            live.cancelled = self.error is None
            try:
                self.engine.abort(req, reason)
            except Exception:
                log.exception("aborting request %d failed", req.rid)
            if req in self._live:  # the engine could not end it: end it here
                req.state, req.reason = State.ABORTED, reason
                self._on_end(req)

    def _emit(self, sub: Subscriber, event: Event) -> None:
        self._outbox.append((sub, event))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        dispatch(outbox)

    def _close(self) -> None:
        """Refuse further commands, answer those already queued, send the last events."""
        with self._lock:
            self._closed = True
        if self._stop_at is None:
            self._stop_at = time.monotonic()
        self._take_commands(block=False)
        self._abort_all(self.error or SHUTTING_DOWN)
        self._flush()
        if self.engine.step_log is not None:
            self.engine.step_log.close()
