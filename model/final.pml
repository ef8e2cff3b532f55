/*
 * The final stage (patches 7 to 10): airflow_overlay/3.3/airflow/executors/local_executor.py, as recorded in
 * model/overlay.sha256 (review this model whenever that file changes, then `python -m tools model
 * --rehash`).
 *
 * One input pipe and one result pipe per worker slot, each with one writer and one reader; a workload
 * goes only to an idle worker; results are read without blocking and a frame is delivered only once
 * complete; a dead worker is found by waitid(WNOWAIT) (_exited) and handled in _reap_workers: patch 8
 * first SIGKILLs what the worker started (its session), which touches no pipe or key and is not
 * modelled, then calls _reap_worker, modelled as one step.
 *
 * One executor thread (patch 9 keeps the workers busy from the scheduler's own thread, starting none).
 * The scheduler's thread (proctype Executor) is the only reader of results and the only writer of
 * workloads, and changes state only with SIGTERM and SIGINT held off (``@_held_off`` on each method that
 * moves a workload): _process_workloads' and _check_workers' (from sync(), and after _process_workloads).
 * slots_available and slots_occupied run only its first part (_read_results: read and apply results,
 * never reap, never dispatch, never start a worker); the model lets a worker die between any two of its
 * steps, so this step, followed by a death, covers what they do. _check_workers reads and applies results and reaps the dead (one
 * atomic step), then hands each pending workload to an idle live worker, starting workers up to
 * parallelism (_dispatch_pending): a step picks the worker and starts the frame, then each page of it is
 * a step, the workers and the Killer running between them while the scheduler's thread does nothing
 * else. Such a write waits only for its worker's read: an idle worker's input pipe is empty (asserted)
 * and the worker writes nothing until it has read the whole frame (W is larger than the model's pipe, so
 * the write does wait for that read; a real workload is much smaller than a real pipe); a worker that
 * dies first makes it fail (EPIPE): the workload goes back to the front of _pending and the worker is
 * reaped. SIGTERM (up to TERMS times) is handled only between the scheduler's blocks (a held-off one is
 * re-raised right after its block), at any point of its loop but never part way through a write; then
 * the scheduler calls end(). How many workloads the scheduler hands over (no more than its free slots,
 * as BaseExecutor keeps the rest) and the priority order of _pending are not modelled: all K, of one
 * priority, are handed over in one _process_workloads batch.
 *
 * Patch 9's start acknowledgement: a worker writes a STARTED frame (ACKF units) as soon as it has
 * forked the task process ("os.register_at_fork(after_in_parent=acknowledge_start)"); a workload whose
 * worker died before that frame was read is put back at the front of _pending (up to MAXRD times) and
 * goes to another worker, one that started is failed. The task process forked before the frame dies
 * with the worker's session (_kill_left_behind, not modelled); the model takes, as the overlay does,
 * that it has done nothing worth keeping before the frame is complete: ranby[k] (the task started) is
 * set once it is (-DNOACK leaves the acknowledgement out: a third of the states, every lost workload
 * failed as before patch 9). Where task-sdk spawns the task process (no at-fork handler runs there)
 * the worker writes the frame before the workload runs: the same order, frame first, so the same model.
 * Patch 8's spawn where the start method is forkserver changes how a worker starts, not the protocol.
 * SIGKILL of any worker at any step (the Killer, up to KILLS times).
 *
 * Keys are 1..K; a worker sends a running frame (RUNF units), a STARTED frame (ACKF units) and a
 * terminal frame (R units) per workload; workloads are W units; None is 1 unit.
 * Comments tagged @op name the real operation a step stands for (function: "a quote of the line"),
 * @wait what a process stuck there waits for; `python -m tools model` writes trails with them.
 */

#ifndef N
#define N 2
#endif
#ifndef K
#define K 3
#endif
#ifndef W
#define W 5
#endif
#ifndef R
#define R 5
#endif
#ifndef RUNF
#define RUNF 1
#endif
#ifndef ACKF
#define ACKF 1
#endif
#define PILL 1
#ifndef KILLS
#define KILLS 1
#endif
#ifndef TERMS
#define TERMS 1
#endif
#ifndef MAXRD
#define MAXRD 3        /* LocalExecutor.max_redispatch */
#endif

#include "pipes.pml"

#ifdef NOACK
#define ACKON false
#else
#define ACKON true
#endif
#define ST_STARTED 4   /* STARTED = "lepatch:started" */

#define IN(w) (w)
#define OUT(w) (N + (w))

byte plen[2 * N];
byte poff[2 * N];
bool rgone[2 * N];     /* no reader left: a write fails with EPIPE */
byte owed[2 * N];      /* units of the frame being written that are not in the pipe yet */
bool corrupt[2 * N];   /* a frame was started behind a torn one: the reader would mix two messages */

bool inuse[N];         /* in self.workers: from _spawn_worker to _reap_worker */
bool alive[N];         /* not _exited(proc) */
byte gen[N];
byte wpid[N];
byte phase[N];
byte wkey[N];          /* self._worker_tasks[pid] */
bool unst[N];          /* pid in self._unstarted */
byte rbuf[N];          /* len(_ResultReader.buffer) */
chan infr[N] = [2] of { byte };          /* keys of the frames in the input pipe, oldest first; 0 = None */
chan outfr[N] = [3] of { byte, byte };   /* (key, state) of the frames in the result pipe and buffer */

byte pq[K];            /* self._pending */
byte pqn;
byte dcount[K + 1];    /* self._dispatch_counts; nonzero: the key is in self.running */
byte rd[K + 1];        /* self._redispatched */
byte outcome[K + 1];
byte ranby[K + 1];     /* _pid of the worker that started the key */
byte kills;
byte terms;

#define SLOTS_USED ((inuse[0] -> 1 : 0) + (N > 1 && inuse[1] -> 1 : 0) + (N > 2 && inuse[2] -> 1 : 0))
#define IDLE(i) (N > i && inuse[i] && alive[i] && wkey[i] == 0)
#define HASIDLE (IDLE(0) || IDLE(1) || IDLE(2))
#define IDLES ((IDLE(0) -> 1 : 0) + (IDLE(1) -> 1 : 0) + (IDLE(2) -> 1 : 0))
#define REAPABLE(i) (N > i && inuse[i] && !alive[i])
#define READABLE(i) (N > i && inuse[i] && plen[OUT(i)] > 0)
#define ANYREADABLE (READABLE(0) || READABLE(1) || READABLE(2))
#define SOMEREADY (REAPABLE(0) || REAPABLE(1) || REAPABLE(2) || ANYREADABLE)
#define ALLENDED ((outcome[1] != NONE) && (K < 2 || outcome[2] != NONE) && (K < 3 || outcome[3] != NONE) \
                  && (K < 4 || outcome[4] != NONE))

inline sigkill(w) {
    alive[w] = false;
    rgone[IN(w)] = true
}

proctype Worker(byte w; byte g) {
    byte k, st, need, rem, n;
    {
        do  /* @wait worker: _run_worker "workload = input.recv()": the input pipe is empty */
        :: d_step {
               /* @op worker: _run_worker "workload = input.recv()" reads a workload */
               plen[IN(w)] > 0 -> infr[w]?<k>; need = (k == 0 -> PILL : W); phase[w] = PH_READ;
               pipe_take(IN(w), need, n); n = 0
           };
           do  /* @wait worker: "input.recv()": the rest of the frame */
           :: d_step { need == 0 -> infr[w]?k; assert(!corrupt[IN(w)]); phase[w] = (k == 0 -> PH_IDLE : PH_RUN) };
              break
           :: d_step { need > 0 && plen[IN(w)] > 0 -> pipe_take(IN(w), need, n); n = 0 }  /* @op worker: "input.recv()" reads more of the frame */
           od;
           if
           :: k == 0 -> break  /* @op worker: "if workload is None: return" (poison pill) */
           :: else
           fi;
           rem = RUNF;
           d_step { WRITABLE(OUT(w)) -> outfr[w]!k, ST_RUNNING; pipe_put(OUT(w), rem, n); n = 0 };  /* @op worker: "_send_result(output, (key, workload.running_state, None))" */
           do  /* @wait worker: _send_result(running) "os.write": the result pipe is full */
           :: rem == 0 -> break
           :: d_step { rem > 0 && WRITABLE(OUT(w)) -> pipe_put(OUT(w), rem, n); n = 0 }
           od;
#ifndef NOACK
           /* "BaseExecutor.run_workload(workload, ...)" forks the task process; right after the fork, in the
              worker, acknowledge_start ("os.register_at_fork(after_in_parent=acknowledge_start)") */
           rem = ACKF;
           d_step { WRITABLE(OUT(w)) -> outfr[w]!k, ST_STARTED; pipe_put(OUT(w), rem, n); n = 0 };  /* @op worker: acknowledge_start "_send_result(output, (key, STARTED, None))" */
           do  /* @wait worker: _send_result(STARTED) "os.write": the result pipe is full */
           :: rem == 0 -> ranby[k] = _pid; break  /* @op worker: "BaseExecutor.run_workload(workload, ...)": the task runs */
           :: d_step { rem > 0 && WRITABLE(OUT(w)) -> pipe_put(OUT(w), rem, n); n = 0 }
           od;
#else
           ranby[k] = _pid;
#endif
           rem = R;
           d_step {  /* @wait worker: _send_result "os.write": the result pipe is full */
               /* @op worker: "_send_result(output, (key, workload.success_state, None))" first page */
               WRITABLE(OUT(w)) -> outfr[w]!k, ST_DONE; phase[w] = PH_WRITE; pipe_put(OUT(w), rem, n); n = 0
           };
           do  /* @wait worker: _send_result "os.write": the result pipe is full */
           :: rem == 0 -> break
           :: d_step { rem > 0 && WRITABLE(OUT(w)) -> pipe_put(OUT(w), rem, n); n = 0 }  /* @op worker: _send_result "os.write" another page */
           od;
           atomic { phase[w] = PH_IDLE; k = 0 }
        od;
        atomic { alive[w] = false; rgone[IN(w)] = true }  /* @op worker: exits */
    } unless { gen[w] != g || !alive[w] }  /* @op worker: killed: the process is gone */
}

/* SIGKILL of any worker at any step (idle, mid-read, mid-task, mid-frame), up to KILLS times; the
   killed worker's `unless` ends it at once, whatever it held stays held. A SIGTERM to a worker is the
   same step: the worker keeps SIGTERM's default disposition and handles nothing. */
#define KILLOPT(i) :: d_step { N > i && kills < KILLS && alive[i] && KILLABLE(i) -> \
                       kills++; sigkill(i); printf("SIGKILL pid %d\n", wpid[i]) }
active proctype Killer() {
end:
    do
    KILLOPT(0)  /* @op SIGKILL */
    KILLOPT(1)  /* @op SIGKILL */
    KILLOPT(2)  /* @op SIGKILL */
    od
}

inline spawn(i) {
    /* _spawn_worker: "input_r, input_w = multiprocessing.Pipe(duplex=False)" ... "p.start()" */
    plen[IN(i)] = 0; poff[IN(i)] = 0; rgone[IN(i)] = false; owed[IN(i)] = 0; corrupt[IN(i)] = false;
    plen[OUT(i)] = 0; poff[OUT(i)] = 0;
    do
    :: infr[i]?_
    :: empty(infr[i]) -> break
    od;
    do
    :: outfr[i]?_, _
    :: empty(outfr[i]) -> break
    od;
    rbuf[i] = 0; wkey[i] = 0; unst[i] = false; phase[i] = PH_IDLE; inuse[i] = true; alive[i] = true;
    gen[i] = gen[i] + 1;
    wpid[i] = run Worker(i, gen[i])
}

inline end_dispatch(k, how) {
    /* _finish_dispatch: "remaining = self._dispatch_counts.pop(key, 1) - 1" */
    dcount[k] = dcount[k] - 1;
    if
    :: dcount[k] == 0 -> assert(outcome[k] == NONE); outcome[k] = how
    :: else
    fi
}

inline collect_frame(w, k, st) {
    /* _handle_result, as _read_results reads each frame: "if state == STARTED: if held:
       self._unstarted.pop(pid, None)"; a terminal one of the key the worker holds: "del
       self._worker_tasks[pid]" ... "self._finish_dispatch(key, state, exc, dispatch, pid)", which reports
       it "elif key in self.running". A running one, or one of a key the worker no longer holds, is a no-op
       (the key goes to another pid only once this one is reaped). Each key is dispatched once here, so no
       dispatch is ever stale (_stale: an earlier dispatch of a key dispatched again, whose end is logged
       and dropped) */
    if
    :: st == ST_STARTED && wkey[w] == k -> unst[w] = false
    :: st == ST_DONE && wkey[w] == k ->
       unst[w] = false; wkey[w] = 0;
       if
       :: dcount[k] > 0 ->
          /* no result is reported for a key other than its own: it came from the worker that ran it */
          assert(ranby[k] == wpid[w]);
          end_dispatch(k, SUCCESS)
       :: else
       fi
    :: else
    fi
}

inline read_output(w) {
    /* _ResultReader.read: "chunk = os.read(self.conn.fileno(), 1 << 16)" until BlockingIOError, then
       each complete frame: "if len(self.buffer) < end: break" */
    rbuf[w] = rbuf[w] + plen[OUT(w)]; plen[OUT(w)] = 0; poff[OUT(w)] = 0;
    do
    :: empty(outfr[w]) -> break
    :: nempty(outfr[w]) ->
       outfr[w]?<k, st>;
       n = (st == ST_RUNNING -> RUNF : (st == ST_STARTED -> ACKF : R));
       if
       :: rbuf[w] >= n -> outfr[w]?k, st; rbuf[w] = rbuf[w] - n; collect_frame(w, k, st)
       :: else -> break
       fi
    od;
    k = 0; st = 0; n = 0
}

inline collect_all() {
    /* _read_results: "for pid in list(self._outputs) if pids is None else pids:" */
    for (i : 0 .. N - 1) {
        if :: inuse[i] -> read_output(i) :: else fi
    }
}

inline fail_lost(w) {
    /* _fail_lost_workload: "unstarted = self._unstarted.pop(pid, None)"; "key = self._worker_tasks.pop(pid, None)";
       "if key is None: return"; "if self._stale(key, dispatch) or key not in self.running:" end it
       unreported (never here: a key is dispatched once) */
    k = wkey[w]; wkey[w] = 0; st = unst[w]; unst[w] = false;
    if
    :: k != 0 && dcount[k] > 0 && st && rd[k] < MAXRD ->
       /* "if redispatched < self.max_redispatch:" ... "self._pending.appendleft(unstarted)" */
       assert(ranby[k] == 0);  /* re-dispatched: never started */
       rd[k]++;
       for (n : 1 .. K - 1) { pq[K - n] = pq[K - n - 1] }
       pq[0] = k; pqn++
    :: k != 0 && dcount[k] > 0 && !(st && rd[k] < MAXRD) ->
       /* "self._finish_dispatch(key, state_class_for_key(key).FAILED, ...)" */
       assert(!alive[w]); end_dispatch(k, FAILED)
    :: else
    fi
}

inline reap(w) {
    /* _reap_worker: "self._read_results(pids=[pid])", drop a partial frame, close both
       pipes, "del self.workers[pid]", join, "self._fail_lost_workload(pid)" */
    read_output(w); inuse[w] = false; rbuf[w] = 0; fail_lost(w)
}

inline reap_dead() {
    /* "if dead := [pid for pid, proc in self.workers.items() if _exited(proc)]": "self._reap_workers(dead)":
       _kill_left_behind (not modelled), then _reap_worker for each */
    for (i : 0 .. N - 1) {
        if
        :: inuse[i] && !alive[i] -> reap(i)
        :: else
        fi
    }
}

inline dispatch_pending() {
    /* "self._dispatch_pending()": "while self._pending:" */
    do
    :: d_step { pqn == 0 || (!HASIDLE && SLOTS_USED == N) -> w = 0; k = 0 }; break  /* @op executor: _dispatch_pending "while self._pending:" ends, or "if pid is None:" ... "return" (every worker busy) */
    :: atomic {
           /* "pid = self._idle_worker()": "if pid not in self._worker_tasks and not _exited(proc): return pid";
              else "if len(self.workers) >= self.parallelism:" "return None"; with fork
              "self._spawn_workers_with_gc_freeze(self.parallelism - len(self.workers))",
              "return next(pid for pid in self.workers if pid not in before)" */
           pqn > 0 && (HASIDLE || SLOTS_USED < N) ->
           if
           :: HASIDLE -> w = (IDLE(0) -> 0 : (IDLE(1) -> 1 : 2))
           :: else ->
              w = (!inuse[0] -> 0 : (!inuse[1] -> 1 : 2));
              for (i : 0 .. N - 1) {
                  if
                  :: !inuse[i] -> spawn(i)
                  :: else
                  fi
              }
           fi;
           /* "workload, taken_from = self._pending.popleft()"; "self._worker_tasks[pid] = workload.key";
              "self._unstarted[pid] = (workload, taken_from)" */
           k = pq[0];
           for (i : 1 .. K - 1) { pq[i - 1] = pq[i] }
           pq[K - 1] = 0; pqn--; wkey[w] = k; unst[w] = ACKON;
           /* "self._send_workload(pid, workload)": "self._inputs[pid].send_bytes(data)" starts a frame. No
              cyclic wait: the worker is idle, so it has read all it was sent and waits for more */
           assert(plen[IN(w)] == 0 && owed[IN(w)] == 0);
           infr[w]!k; owed[IN(w)] = W; rem = W; i = 0
       };  /* @op executor: _dispatch_pending "workload, taken_from = self._pending.popleft()" */
       do  /* @wait executor: _send_workload "self._inputs[pid].send_bytes(data)": the input pipe is full (SIGTERM held off) */
       :: rem == 0 -> break
       :: d_step { rem > 0 && !rgone[IN(w)] && WRITABLE(IN(w)) -> pipe_put(IN(w), rem, n); n = 0; owed[IN(w)] = rem }  /* @op executor: _send_workload "self._inputs[pid].send_bytes(data)" writes a page */
       :: atomic {
              /* BrokenPipeError: "self.workers[pid].kill()"; "del self._worker_tasks[pid]";
                 "self._unstarted.pop(pid, None)"; "self._pending.appendleft((workload, taken_from))";
                 "self._reap_workers([pid])"; "continue" */
              rem > 0 && rgone[IN(w)] ->
              if :: alive[w] -> sigkill(w) :: else fi;
              wkey[w] = 0; unst[w] = false;
              assert(ranby[k] == 0);  /* back in the deque: never started */
              for (i : 1 .. K - 1) { pq[K - i] = pq[K - i - 1] }
              pq[0] = k; pqn++; rem = 0;
              reap(w);
              w = 0; i = 0; k = 0; st = 0; n = 0
          }; break  /* @op executor: _dispatch_pending "self._pending.appendleft((workload, taken_from))"; "self._reap_workers([pid])" */
       od
    od
}

inline check_workers() {
    /* _check_workers, one block "with self._held_off:": "self._read_results()" (each frame applied as it is read),
       reap the dead, then "self._dispatch_pending()" */
    atomic {
        collect_all();
        reap_dead();
        i = 0; k = 0; st = 0; n = 0
    };
    dispatch_pending()
}

inline send_pill(w) {
    /* end(): "self._send_workload(pid, None)" ("with contextlib.suppress(OSError):"); only the scheduler's
       thread writes, and none of its writes was cut part way (SIGTERM is held off in its blocks) */
    d_step {
        if
        :: owed[IN(w)] > 0 -> corrupt[IN(w)] = true
        :: else
        fi;
        infr[w]!0; owed[IN(w)] = PILL; rem = PILL
    };
    do  /* @wait executor: end() _send_workload(pid, None) "send_bytes(data)": the input pipe is full */
    :: rem == 0 -> break
    :: d_step { rem > 0 && !rgone[IN(w)] && WRITABLE(IN(w)) -> pipe_put(IN(w), rem, n); n = 0; owed[IN(w)] = rem }  /* @op executor: end() "self._send_workload(pid, None)" writes */
    :: d_step { rem > 0 && rgone[IN(w)] -> if :: alive[w] -> sigkill(w) :: else fi }; break  /* @op executor: end() "self._send_workload(pid, None)" fails: BrokenPipeError, suppressed */
    od
}

/* The scheduler calls sync() every heartbeat (and slots_available and slots_occupied run its reads):
   nothing its blocks look at changes until a result or a dead worker is there, or a
   pending workload has an idle worker or room to start one; the model waits for that (or for every other
   process to be stuck, Promela's timeout). */
#define SYNC_READY (SOMEREADY || (pqn > 0 && (HASIDLE || SLOTS_USED < N)))

active proctype Executor() {
    byte w, k, st, i, n, rem;
    /* start(): "self._spawn_workers_with_gc_freeze(self.parallelism)" */
    atomic {
        for (i : 0 .. N - 1) { spawn(i) }
    };
    /* _process_workloads: "with self._held_off:" ... "taken_from = self._take_queued(workload)";
       "self.running.add(key)"; "self._dispatch_counts[key] = ..."; "self._add_pending(workload, taken_from)"
       (all of one priority_weight: each goes to the back) */
    d_step {
        for (i : 1 .. K) { dcount[i] = 1; pq[i - 1] = i }
        pqn = K
    };
    if
    :: terms < TERMS -> terms++; goto sigterm  /* @op executor: SIGTERM: SystemExit right after a "with self._held_off:" block */
    :: true
    fi;
    check_workers();  /* @op executor: _process_workloads "self._check_workers()" */
    /* the scheduler: sync() every heartbeat until every key has ended */
    do  /* @wait executor: sync(): a result, a dead worker, or a free worker for a pending workload */
    :: ALLENDED -> break
    :: !ALLENDED && SYNC_READY -> check_workers()  /* @op executor: sync() "self._check_workers()" */
    :: terms < TERMS -> terms++; goto sigterm  /* @op executor: SIGTERM: SystemExit between two "with self._held_off:" blocks */
    :: timeout -> break  /* nothing can move any more: the scheduler stops the executor */
    od;
sigterm:
    /* end() starts nothing more: "self._stop_dispatching()" first (it touches nothing modelled here), and
       nothing in end() dispatches: what is pending is given back below. A step of its own: the `for`
       below begins with `i = 0`, which a goto to a label on it would skip */
    atomic { w = 0; k = 0 };  /* @op executor: end() "self._stop_dispatching()" */
    /* "for pid in list(self.workers):" */
    for (i : 0 .. N - 1) {
        if
        :: inuse[i] -> w = i; send_pill(w)  /* @op executor: end() "self._send_workload(pid, None)" */
        :: else
        fi
    }
    /* "while self.workers: self._read_results(timeout=0.1)"; "self._reap_workers(exited)" */
    do  /* @wait executor: end() "while self.workers": a result or a dead worker */
    :: SLOTS_USED == 0 -> break
    :: SLOTS_USED > 0 && SOMEREADY -> atomic { collect_all(); reap_dead() }  /* @op executor: end() "while self.workers:" */
    od;
    /* finally, "with self._held_off:": "self._undo_dispatches([w for w, _ in unsent], [q for _, q in unsent])":
       every workload no worker took: pending when end() began, or put back in the deque when its worker
       died unstarted while end() waited */
    atomic {
        for (i : 0 .. K - 1) {
            if
            :: i < pqn ->
               k = pq[i];
               dcount[k] = dcount[k] - 1;
               assert(dcount[k] == 0 && outcome[k] == NONE);
               assert(ranby[k] == 0);  /* given back to the scheduler: never started */
               outcome[k] = QUEUED
            :: else
            fi
        }
        pqn = 0
    };  /* @op executor: end() finally "self._undo_dispatches(...)" */
end_done:
    /* every dispatched workload ended exactly once (end_dispatch asserts "once") */
    assert(ALLENDED)  /* @op executor: end() has returned */
}
