/*
 * The final stage (patches 8 to 10): airflow_overlay/3.3/airflow/executors/local_executor.py, as recorded in
 * model/overlay.sha256 (review this model whenever that file changes, then `python -m tools model
 * --rehash`).
 *
 * One input pipe and one result pipe per worker slot, each with one writer and one reader; a workload
 * goes only to an idle worker; results are read without blocking and a frame is delivered only once
 * complete; a dead worker is found by waitid(WNOWAIT) (_exited) and handled in _reap_workers: patch 9
 * first SIGKILLs what the worker started (its session), which touches no pipe or key and is not
 * modelled, then calls _reap_worker, modelled as one step as before. Patch 10's handoff thread
 * (reads results and sends pending workloads to idle workers, under the executor's lock, while the
 * scheduler's thread waits) and its prefetch are NOT modelled: this model checks the protocol with
 * one executor thread. SIGKILL of any
 * worker at any step (the Killer, up to KILLS times); SIGTERM of the executor while it writes a
 * workload (up to TERMS times): the scheduler's handler raises SystemExit inside the write, and the
 * scheduler then calls end(). With TERM_AFTER_WRITE the SystemExit may also come after the last byte,
 * while _send_workload is still inside its try (Python runs a handler at its next bytecode check).
 *
 * Keys are 1..K, all handed over in one _process_workloads batch; a worker sends a running frame
 * (RUNF units) and a terminal frame (R units) per workload; workloads are W units; None is 1 unit.
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
#define PILL 1
#ifndef KILLS
#define KILLS 1
#endif
#ifndef TERMS
#define TERMS 1
#endif

#include "pipes.pml"

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
byte rbuf[N];          /* len(_ResultReader.buffer) */
chan infr[N] = [2] of { byte };          /* keys of the frames in the input pipe, oldest first; 0 = None */
chan outfr[N] = [3] of { byte, byte };   /* (key, state) of the frames in the result pipe and buffer */

byte pq[K];            /* self._pending */
byte pqn;
byte dcount[K + 1];    /* self._dispatch_counts; nonzero: the key is in self.running */
byte outcome[K + 1];
byte ranby[K + 1];     /* _pid of the worker that started the key */
byte kills;
byte terms;
bool in_end;

#define SLOTS_USED ((inuse[0] -> 1 : 0) + (N > 1 && inuse[1] -> 1 : 0) + (N > 2 && inuse[2] -> 1 : 0))
#define IDLE(i) (N > i && inuse[i] && alive[i] && wkey[i] == 0)
#define HASIDLE (IDLE(0) || IDLE(1) || IDLE(2))
#define REAPABLE(i) (N > i && inuse[i] && !alive[i])
#define READABLE(i) (N > i && inuse[i] && plen[OUT(i)] > 0)
#define SOMEREADY (REAPABLE(0) || REAPABLE(1) || REAPABLE(2) || READABLE(0) || READABLE(1) || READABLE(2))
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
               pipe_take(IN(w), need, n)
           };
           do  /* @wait worker: "input.recv()": the rest of the frame */
           :: d_step { need == 0 -> infr[w]?k; assert(!corrupt[IN(w)]); phase[w] = (k == 0 -> PH_IDLE : PH_RUN) };
              break
           :: d_step { need > 0 && plen[IN(w)] > 0 -> pipe_take(IN(w), need, n) }  /* @op worker: "input.recv()" reads more of the frame */
           od;
           if
           :: k == 0 -> break  /* @op worker: "if workload is None: return" (poison pill) */
           :: else
           fi;
           /* "_send_result(output, (key, workload.running_state, None))" */
           rem = RUNF;
           d_step { WRITABLE(OUT(w)) -> outfr[w]!k, ST_RUNNING; pipe_put(OUT(w), rem, n) };  /* @op worker: _send_result(running) */
           do  /* @wait worker: _send_result(running) "os.write": the result pipe is full */
           :: rem == 0 -> ranby[k] = _pid; break  /* @op worker: "BaseExecutor.run_workload(workload, ...)" starts the task */
           :: d_step { rem > 0 && WRITABLE(OUT(w)) -> pipe_put(OUT(w), rem, n) }
           od;
           rem = R;
           d_step {  /* @wait worker: _send_result "os.write": the result pipe is full */
               /* @op worker: _send_result(success) "os.write(output.fileno(), frame)" first page */
               WRITABLE(OUT(w)) -> outfr[w]!k, ST_DONE; phase[w] = PH_WRITE; pipe_put(OUT(w), rem, n)
           };
           do  /* @wait worker: _send_result "os.write": the result pipe is full */
           :: rem == 0 -> break
           :: d_step { rem > 0 && WRITABLE(OUT(w)) -> pipe_put(OUT(w), rem, n) }  /* @op worker: _send_result "os.write" another page */
           od;
           phase[w] = PH_IDLE
        od;
        atomic { alive[w] = false; rgone[IN(w)] = true }  /* @op worker: exits */
    } unless { gen[w] != g || !alive[w] }  /* @op worker: killed: the process is gone */
}

/* SIGKILL of any worker at any step (idle, mid-read, mid-task, mid-frame), up to KILLS times; the
   killed worker's `unless` ends it at once, whatever it held stays held. */
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
    rbuf[i] = 0; wkey[i] = 0; phase[i] = PH_IDLE; inuse[i] = true; alive[i] = true; gen[i] = gen[i] + 1;
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

inline handle_result(w, k, st) {
    /* _handle_result ("if pid not in self.workers: return" never holds: a reaped worker's pipe is read
       before "del self.workers[pid]"); running: "self.change_state(key, state, remove_running=False)" */
    if
    :: st == ST_RUNNING -> skip
    :: st != ST_RUNNING && wkey[w] != k -> skip  /* "elif self._worker_tasks.get(pid) == key:" does not hold */
    :: st != ST_RUNNING && wkey[w] == k ->
       wkey[w] = 0;  /* "del self._worker_tasks[pid]" */
       if
       :: dcount[k] > 0 ->
          /* no result is reported for a key other than its own: it came from the worker that ran it */
          assert(ranby[k] == wpid[w]);
          end_dispatch(k, SUCCESS)  /* "if key in self.running: self._finish_dispatch(key, state, exc)" */
       :: else
       fi
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
       n = (st == ST_RUNNING -> RUNF : R);
       if
       :: rbuf[w] >= n -> outfr[w]?k, st; rbuf[w] = rbuf[w] - n; handle_result(w, k, st)
       :: else -> break
       fi
    od
}

inline read_results() {
    /* _read_results: "for conn, pid in readers.items(): if conn in ready: ... self._outputs[pid].read()" */
    for (i : 0 .. N - 1) {
        d_step { if :: inuse[i] -> read_output(i) :: else fi }  /* @op executor: _read_results reads a worker's result pipe */
    }
}

inline fail_lost(w) {
    /* _fail_lost_workload: "key = self._worker_tasks.pop(pid, None)"; "if key is not None and key in
       self.running:" ... "self._finish_dispatch(key, state_class_for_key(key).FAILED, ...)" */
    k = wkey[w]; wkey[w] = 0;
    if
    :: k != 0 && dcount[k] > 0 -> assert(!alive[w]); end_dispatch(k, FAILED)
    :: else
    fi
}

inline reap(w) {
    /* _reap_worker: "for key, state, exc in output.read(): self._handle_result(...)", drop a partial
       frame, close both pipes, "del self.workers[pid]", join, "self._fail_lost_workload(pid)" */
    d_step { inuse[w] = false; read_output(w); rbuf[w] = 0; fail_lost(w) }  /* @op executor: _reap_worker */
}

inline reap_dead() {
    /* _check_workers: "if dead := [pid for pid, proc in self.workers.items() if _exited(proc)]",
       then _reap_workers: _kill_left_behind (not modelled), then _reap_worker for each */
    for (i : 0 .. N - 1) {
        if
        :: inuse[i] && !alive[i] -> reap(i)
        :: else
        fi
    }
}

inline idle_worker() {
    /* _idle_worker: "if pid not in self._worker_tasks and not _exited(proc): return pid", else fork every
       missing worker ("self._spawn_workers_with_gc_freeze(self.parallelism - len(self.workers))") */
    w = N;
    for (i : 0 .. N - 1) {
        if
        :: w == N && inuse[i] && alive[i] && wkey[i] == 0 -> w = i
        :: else
        fi
    }
    if
    :: w == N && SLOTS_USED < N ->
       atomic {
           for (i : 0 .. N - 1) {
               if
               :: !inuse[i] -> spawn(i); if :: w == N -> w = i :: else fi
               :: else
               fi
           }
       }
    :: else
    fi
}

inline send_workload(w, k, size) {
    /* _send_workload: "self._inputs[pid].send_bytes(data)" */
    res = 0;
    d_step {
        if
        :: owed[IN(w)] > 0 -> corrupt[IN(w)] = true
        :: else
        fi;
        infr[w]!k; owed[IN(w)] = size; rem = size
    };
    do  /* @wait executor: _send_workload "send_bytes(data)": the input pipe is full */
    :: rem == 0 -> break
    :: d_step { rem > 0 && !rgone[IN(w)] && WRITABLE(IN(w)) -> pipe_put(IN(w), rem, n); owed[IN(w)] = rem }  /* @op executor: _send_workload "send_bytes(data)" writes a page */
    :: d_step { rem > 0 && rgone[IN(w)] -> res = 1 }; break  /* @op executor: _send_workload "send_bytes" fails: BrokenPipeError */
    :: d_step { rem > 0 && k != 0 && !in_end && terms < TERMS -> terms++; res = 2 }; break  /* @op executor: SIGTERM: SystemExit raised inside "send_bytes(data)" */
    od;
#ifdef TERM_AFTER_WRITE
    if
    :: d_step { res == 0 && k != 0 && !in_end && terms < TERMS -> terms++; res = 2 }  /* @op executor: SIGTERM: SystemExit raised after "send_bytes(data)" wrote the last byte, still inside its try */
    :: else
    fi;
#endif
    if
    :: res != 0 -> d_step { if :: alive[w] -> sigkill(w) :: else fi }  /* @op executor: _send_workload except: "self.workers[pid].kill()" */
    :: else
    fi
}

inline dispatch_pending() {
    /* _dispatch_pending: "while self._pending:" */
    do
    :: pqn == 0 -> break
    :: pqn > 0 ->
       idle_worker();
       if
       :: w == N -> break  /* "if pid is None: ... return" */
       :: else
       fi;
       d_step {
           /* "workload, taken_from = self._pending.popleft()"; "self._worker_tasks[pid] = workload.key" */
           k = pq[0];
           for (i : 1 .. K - 1) { pq[i - 1] = pq[i] }
           pq[K - 1] = 0; pqn--; wkey[w] = k
       };
       send_workload(w, k, W);
       if
       :: res == 1 ->
          /* "except BrokenPipeError:" keep it for the next worker, then reap this one */
          d_step {
              wkey[w] = 0;
              assert(ranby[k] == 0);  /* re-dispatched: never started */
              for (i : 1 .. K - 1) { pq[K - i] = pq[K - i - 1] }
              pq[0] = k; pqn++
          };  /* @op executor: _dispatch_pending "self._pending.appendleft((workload, taken_from))" */
          reap(w)
       :: res == 2 ->
          /* "except BaseException:" _undo_dispatches: the key goes back to its queue, then re-raise */
          d_step {
              wkey[w] = 0;
              dcount[k] = dcount[k] - 1;
              assert(dcount[k] == 0 && outcome[k] == NONE);
              assert(ranby[k] == 0);  /* given back to the scheduler: never started */
              outcome[k] = QUEUED
          };  /* @op executor: _dispatch_pending "self._undo_dispatches([workload], [taken_from])"; raise */
          break
       :: res == 0
       fi
    od
}

inline check_workers() {
    /* _check_workers: "self._read_results()", reap the dead, "self._dispatch_pending()" */
    read_results();
    reap_dead();
    dispatch_pending()
}

/* the executor's wait(readers + sentinels, timeout) in a loop: nothing changes until one is ready, so
   the model waits for that (or for every other process to be stuck, Promela's timeout) */
#define SYNC_READY (SOMEREADY || (pqn > 0 && (HASIDLE || SLOTS_USED < N)))

active proctype Executor() {
    byte w, k, st, i, n, rem, res;
    /* start(): "self._spawn_workers_with_gc_freeze(self.parallelism)" */
    atomic {
        for (i : 0 .. N - 1) { spawn(i) }
    };
    /* _process_workloads: "taken_from = self._take_queued(workload)"; "self.running.add(key)";
       "self._dispatch_counts[key] = ..."; "self._pending.append((workload, taken_from))" */
    d_step {
        for (i : 1 .. K) { dcount[i] = 1; pq[i - 1] = i }
        pqn = K
    };
    check_workers();  /* @op executor: _process_workloads "self._check_workers()" */
    /* the scheduler: sync() every heartbeat until every key has ended */
    do  /* @wait executor: sync(): a result or a dead worker */
    :: res == 2 -> break
    :: ALLENDED -> break
    :: !ALLENDED && res != 2 && SYNC_READY -> check_workers()  /* @op executor: sync() "self._check_workers()" */
    :: timeout -> break  /* nothing can move any more: the scheduler stops the executor */
    od;
    /* end() */
    in_end = true;
    /* "while self._pending: self._read_results(timeout=0.1); self._check_workers()" */
    do  /* @wait executor: end() "while self._pending": a result or a dead worker */
    :: pqn == 0 -> break
    :: pqn > 0 && SYNC_READY -> read_results(); check_workers()  /* @op executor: end() "while self._pending:" */
    od;
    /* "for pid in list(self.workers): ... self._send_workload(pid, None)" */
    for (i : 0 .. N - 1) {
        if
        :: inuse[i] -> w = i; send_workload(w, 0, PILL)  /* @op executor: end() "self._send_workload(pid, None)" */
        :: else
        fi
    }
    /* "while self.workers: self._read_results(timeout=0.1)" and reap the dead */
    do  /* @wait executor: end() "while self.workers": a result or a dead worker */
    :: SLOTS_USED == 0 -> break
    :: SLOTS_USED > 0 && SOMEREADY -> read_results(); reap_dead()  /* @op executor: end() "while self.workers:" */
    od;
end_done:
    /* every dispatched workload ended exactly once (end_dispatch asserts "once") */
    assert(ALLENDED)  /* @op executor: end() has returned */
}
