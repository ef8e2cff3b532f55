/*
 * The final stage (patches 7 to 10): airflow_overlay/3.3/airflow/executors/local_executor.py, as recorded in
 * model/overlay.sha256 (review this model whenever that file changes, then `python -m tools model
 * --rehash`).
 *
 * One input pipe and one result pipe per worker slot, each with one writer and one reader. The executor
 * keeps no queue of its own: workloads wait in BaseExecutor's queue (queued_tasks, the scheduler's queue,
 * sq[] here) until an idle worker takes one. A dead worker is found by waitid(WNOWAIT) (_exited) and
 * handled in _reap_workers: it first SIGKILLs what the worker started (_kill_left_behind: its orphans),
 * which touches no pipe or key and is not modelled, then, per pid, reads the frames the worker finished,
 * forgets its pipes and itself, and ends the workload it held (_worker_died).
 *
 * One executor thread, the scheduler's (proctype Executor): the only reader of results and the only
 * writer of workloads. Each of its heartbeats (BaseExecutor.heartbeat) is trigger_tasks, which hands
 * _process_workloads the first "open_slots = self.parallelism - len(self.running)" workloads of the queue
 * in priority order (all of one priority here: insertion order, so a workload queued again goes to the
 * back), then sync().
 *
 * _process_workloads is one block held off from SIGTERM and SIGINT (``@_held_off()``): it first calls
 * sync() (read every result, reap the dead), then for each workload picks an idle live worker
 * (_idle_worker, starting workers up to parallelism), writes the whole workload frame to it
 * (_send_workload: non-blocking writes a page at a time, waiting only while the worker lives; the workers
 * and the Killer run between the pages while the scheduler's thread does nothing else), and only then
 * takes it out of BaseExecutor's queue (_take_queued) and records it (running, _newest, _worker_tasks,
 * _unstarted). Such a write waits only for its worker's read: an idle worker's input pipe is empty
 * (asserted) and the worker writes nothing until it has read the whole frame (W is larger than the
 * model's pipe, so the write does wait for that read; a real workload is much smaller than a real pipe).
 * A worker that dies first makes it fail (EPIPE, or "exited" while the pipe is full: BrokenPipeError;
 * _send_workload kills the worker on a failure part way): the dead worker is reaped and the next idle one
 * is tried. When no worker is idle and none can be started, what is left of the batch simply stays in
 * BaseExecutor's queue for the next heartbeat.
 *
 * sync() from the heartbeat is not held off as a whole: _read_results is a block of its own, and so is
 * _worker_died, but _reap_workers between them is not. A SIGTERM (SystemExit from the scheduler's
 * handler, up to TERMS times) comes at any point outside the blocks (one held off inside a block is
 * re-raised right after it): between heartbeats, right after _process_workloads, and between the lines
 * of _reap_workers ("self._outputs.pop(pid).close()", "self._inputs.pop(pid).close()",
 * "proc = self.workers.pop(pid)", "self._worker_died(pid, exitcode)"); then the scheduler calls end().
 * A pid left half reaped makes end() raise KeyError (its "self._inputs[pid]", or the next reap's
 * "self._outputs[pid]"), or, once out of self.workers, leaves its workload in running for ever (never
 * reported, failed or queued again): the assertions hasin/hasout and ALLENDED. The code holds
 * _reap_workers off as one block ("@_held_off()"), and so does the model; -DREAP_UNHELD models the cut
 * that did not, and the check "final/reap not held" finds what it did. slots_available and slots_occupied run only
 * _read_results (read and apply results, never reap, never dispatch, never start a worker); the model
 * lets a worker die between any two of its steps, so sync's read, followed by a death, covers what they do.
 *
 * Result frames are atomic: a worker sends each result (running, STARTED, terminal) with
 * Connection.send() in one write smaller than PIPE_BUF, so the pipe takes it whole (in the last page if
 * it fits there, else in a fresh one) or the worker waits; a worker killed at any step has written whole
 * frames only, and the executor (poll() then recv()) never sees part of one. So RUNF, ACKF and R are at
 * most a page (PG units). Workload frames (executor -> worker) can be larger than the pipe and are
 * written a page at a time.
 *
 * Patch 9's start acknowledgement: a worker writes a STARTED frame as soon as it has forked the task
 * process ("os.register_at_fork(after_in_parent=acknowledge_start)"); a task workload whose worker died
 * before that frame was read goes back into BaseExecutor's queue ("self.queued_tasks[key] =
 * self._newest.pop(key)", up to MAXRD times), its slot freed, and is handed out again at a later
 * heartbeat; one that started is failed. The task process forked before the frame dies with the worker
 * (_kill_left_behind, not modelled); the model takes, as the overlay does, that it has done
 * nothing worth keeping before the frame is written: ranby[k] (the task started) is set with it (-DNOACK
 * leaves the acknowledgement out: every lost workload failed as before patch 9). Where task-sdk spawns
 * the task process (no at-fork handler runs there) the worker writes the frame before the workload runs:
 * the same order, frame first, so the same model. Patch 8's spawn where the start method is forkserver
 * changes how a worker starts, not the protocol. SIGKILL of any worker at any step (the Killer, up to
 * KILLS times).
 *
 * end() sends each worker None, then loops "multiprocessing.connection.wait(...)" + sync() until no worker
 * is left; it queues nothing again: what no worker took is still in BaseExecutor's queue. A signal inside
 * end() (and so its except) is not modelled.
 *
 * Keys are 1..K, all queued before the first heartbeat, each dispatched once at a time (a key dispatched
 * again while an earlier dispatch runs is not modelled, so _newest is the workload a key's worker holds).
 * A worker sends a running frame (RUNF units), a STARTED frame (ACKF units) and a terminal frame (R units)
 * per workload; workloads are W units; None is 1 unit.
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
#define R 2
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

bool inuse[N];         /* pid in self.workers: from _spawn_worker to "self.workers.pop(pid)" */
bool hasin[N];         /* pid in self._inputs */
bool hasout[N];        /* pid in self._outputs */
bool alive[N];         /* not _exited(proc) */
byte gen[N];
byte wpid[N];
byte phase[N];
byte wkey[N];          /* the key of self._worker_tasks[pid] ("key, workload"); 0: idle */
bool unst[N];          /* pid in self._unstarted */
chan infr[N] = [2] of { byte };          /* keys of the frames in the input pipe, oldest first; 0 = None */
chan outfr[N] = [3] of { byte, byte };   /* (key, state) of the (whole) frames in the result pipe */

byte sq[K];            /* BaseExecutor's queued_tasks, as order_queued_tasks_by_priority() lists them */
byte sqn;
bool inrun[K + 1];     /* key in self.running */
byte rd[K + 1];        /* self._redispatched */
byte outcome[K + 1];
byte ranby[K + 1];     /* _pid of the worker that started the key */
byte kills;
byte terms;

#define SLOTS_USED ((inuse[0] -> 1 : 0) + (N > 1 && inuse[1] -> 1 : 0) + (N > 2 && inuse[2] -> 1 : 0))
#define IDLE(i) (N > i && inuse[i] && alive[i] && wkey[i] == 0)
#define HASIDLE (IDLE(0) || IDLE(1) || IDLE(2))
#define REAPABLE(i) (N > i && inuse[i] && !alive[i])
#define READABLE(i) (N > i && hasout[i] && plen[OUT(i)] > 0)
#define ANYREADABLE (READABLE(0) || READABLE(1) || READABLE(2))
#define SOMEREADY (REAPABLE(0) || REAPABLE(1) || REAPABLE(2) || ANYREADABLE)
#define RUNNING ((inrun[1] -> 1 : 0) + (K > 1 && inrun[2] -> 1 : 0) + (K > 2 && inrun[3] -> 1 : 0) \
                 + (K > 3 && inrun[4] -> 1 : 0))
/* trigger_tasks: "open_slots = self.parallelism - len(self.running)" workloads at most */
#define BATCH ((N - RUNNING) < sqn -> (N - RUNNING) : sqn)
#define ALLENDED ((outcome[1] != NONE) && (K < 2 || outcome[2] != NONE) && (K < 3 || outcome[3] != NONE) \
                  && (K < 4 || outcome[4] != NONE))

/* A result frame of `size` units (at most a page: smaller than PIPE_BUF) goes in whole: in the last page
   if it has room for all of it, else in a free page (the rest of the last one stays unused); else the
   writer waits. Only the executor reads a result pipe, always all of it, so the unused rest needs no
   bookkeeping of its own. */
#define FITS(p, size) (ROOM(p) >= (size) || PAGES(p) < SLOTS)
inline put_frame(p, size, n) {
    n = ROOM(p);
    if
    :: n >= size -> plen[p] = plen[p] + size
    :: else -> plen[p] = plen[p] + n + size
    fi
}

inline sigkill(w) {
    alive[w] = false;
    rgone[IN(w)] = true
}

proctype Worker(byte w; byte g) {
    byte k, need, n;
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
           :: k == 0 -> break  /* @op worker: "if workload is None:" "return" (poison pill) */
           :: else
           fi;
           /* @wait worker: "output.send((workload.key, workload.running_state, None))": no room for the frame */
           d_step { FITS(OUT(w), RUNF) -> outfr[w]!k, ST_RUNNING; put_frame(OUT(w), RUNF, n); n = 0 };  /* @op worker: "output.send((workload.key, workload.running_state, None))" */
#ifndef NOACK
           /* "BaseExecutor.run_workload(workload, ...)" forks the task process; right after the fork, in the
              worker, acknowledge_start ("os.register_at_fork(after_in_parent=acknowledge_start)"); the task
              runs once the frame is written */
           /* @wait worker: acknowledge_start "output.send((key, STARTED, None))": no room for the frame */
           d_step { FITS(OUT(w), ACKF) -> outfr[w]!k, ST_STARTED; put_frame(OUT(w), ACKF, n); n = 0; ranby[k] = _pid };  /* @op worker: acknowledge_start "output.send((key, STARTED, None))" */
#else
           ranby[k] = _pid;
#endif
           /* @wait worker: "output.send((workload.key, workload.success_state, None))": no room for the frame */
           d_step { FITS(OUT(w), R) -> outfr[w]!k, ST_DONE; put_frame(OUT(w), R, n); n = 0; phase[w] = PH_IDLE; k = 0 }  /* @op worker: "output.send((workload.key, workload.success_state, None))" */
        od;
        atomic { alive[w] = false; rgone[IN(w)] = true }  /* @op worker: exits */
    } unless { gen[w] != g || !alive[w] }  /* @op worker: killed: the process is gone */
}

/* SIGKILL of any worker at any step (idle, mid-read, mid-task, between two frames), up to KILLS times;
   the killed worker's `unless` ends it at once. A SIGTERM to a worker is the same step: the worker has
   SIGTERM's default disposition ("signal.signal(signal.SIGTERM, signal.SIG_DFL)"). */
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
    /* _spawn_worker: "input_r, input_w = multiprocessing.Pipe(duplex=False)" ... "p.start()";
       "self.workers[p.pid] = p"; "self._inputs[p.pid] = input_w"; "self._outputs[p.pid] = output_r" */
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
    wkey[i] = 0; unst[i] = false; phase[i] = PH_IDLE; inuse[i] = true; hasin[i] = true; hasout[i] = true;
    alive[i] = true; gen[i] = gen[i] + 1;
    wpid[i] = run Worker(i, gen[i])
}

inline end_dispatch(w, how) {
    /* _end_dispatch: "key, workload = self._worker_tasks.pop(pid)"; "self._unstarted.discard(pid)"; the newest
       dispatch of its key (each key is dispatched once at a time here): "super().change_state(key, state,
       info=info, remove_running=not others)"; "self._forget(key)" */
    k = wkey[w]; wkey[w] = 0; unst[w] = false;
    assert(inrun[k]); inrun[k] = false;
    assert(outcome[k] == NONE); outcome[k] = how;
    rd[k] = 0
}

inline handle_result(w, k, st) {
    /* _handle_result: "if self._worker_tasks.get(pid, (None,))[0] != key:" "return"; "if state == STARTED:
       self._unstarted.discard(pid)"; a running one: "self.change_state(key, state, remove_running=False)"
       (no end); a terminal one: "self._end_dispatch(pid, cast("WorkloadState", state), info)" */
    if
    :: st == ST_STARTED && wkey[w] == k -> unst[w] = false  /* @op executor: _handle_result "if state == STARTED:" "self._unstarted.discard(pid)" */
    :: st == ST_DONE && wkey[w] == k ->
       /* no result is reported for a key other than its own: it came from the worker that ran it */
       assert(ranby[k] == wpid[w]);  /* @op executor: _handle_result "self._end_dispatch(pid, cast("WorkloadState", state), info)": reported */
       end_dispatch(w, SUCCESS)
    :: else
    fi
}

inline read_output(w) {
    /* _read_results: "while (output := self._outputs[pid]).poll():" "result = output.recv()";
       "self._handle_result(pid, *result)": every frame in the pipe is whole */
    plen[OUT(w)] = 0; poff[OUT(w)] = 0;
    do
    :: empty(outfr[w]) -> break
    :: outfr[w]?k, st -> handle_result(w, k, st)
    od;
    k = 0; st = 0
}

inline collect_all() {
    /* _read_results: "for pid in list(self._outputs) if pids is None else pids:" */
    for (i : 0 .. N - 1) {
        if :: hasout[i] -> read_output(i) :: else fi
    }
}

inline worker_died(w) {
    /* _worker_died (a block of its own, "@_held_off()") */
    k = wkey[w];
    if
    :: unst[w] && rd[k] < MAXRD ->
       /* "if pid in self._unstarted and workload is self._newest.get(key) and tries < self.max_redispatch:"
          "self._redispatched[key] = tries + 1"; "self.queued_tasks[key] = self._newest.pop(key)" */
       assert(ranby[k] == 0);  /* queued again: never started */
       rd[k]++;
       for (n : 1 .. K) { assert(n > sqn || sq[n - 1] != k) }
       sq[sqn] = k; sqn++;  /* @op executor: _worker_died "self.queued_tasks[key] = self._newest.pop(key)": queued again */
       /* "self._end_dispatch(pid, state_class_for_key(key).FAILED, ...)": not the newest any more:
          "if not others: self.running.discard(key)"; "return" */
       wkey[w] = 0; unst[w] = false; inrun[k] = false
    :: else ->
       /* "self._end_dispatch(pid, state_class_for_key(key).FAILED, f\"LocalExecutor worker pid={pid} died\")" */
       assert(!alive[w]); end_dispatch(w, FAILED)  /* @op executor: _worker_died "self._end_dispatch(pid, state_class_for_key(key).FAILED, ...)" */
    fi;
    n = 0
}

inline reap(w) {
    /* _reap_workers, for one pid: "self._read_results(pids=[pid])"; "self._outputs.pop(pid).close()";
       "self._inputs.pop(pid).close()"; "proc = self.workers.pop(pid)"; "proc.join()";
       "if pid in self._worker_tasks: self._worker_died(pid, exitcode)". A pid missing from _outputs or
       _inputs (a reap cut short by SIGTERM) raises KeyError: asserted */
    assert(hasout[w]); read_output(w); hasout[w] = false;  /* @op executor: _reap_workers "self._read_results(pids=[pid])"; "self._outputs.pop(pid).close()" */
    assert(hasin[w]); hasin[w] = false;
    inuse[w] = false;  /* @op executor: _reap_workers "self._inputs.pop(pid).close()"; "proc = self.workers.pop(pid)" */
    if :: wkey[w] != 0 -> worker_died(w) :: else fi
}

inline reap_dead() {
    /* sync(): "if dead := [pid for pid, proc in self.workers.items() if _exited(proc)]":
       "self._reap_workers(dead)": "_exited(self.workers[pid], timeout=math.inf)",
       "self._kill_left_behind(pids)" (not modelled), then each pid */
    for (i : 0 .. N - 1) {
        if
        :: inuse[i] && !alive[i] -> reap(i)
        :: else
        fi
    }
}

inline reap_unheld(w) {
#ifndef REAP_UNHELD
    /* "@_held_off()" on _reap_workers: a SIGTERM waits until every pid is reaped */
    reap(w)
#else
    /* _reap_workers holds nothing off: a SIGTERM between two of its lines leaves the pid half reaped */
    if
    :: reap(w)
    :: terms < TERMS -> terms++; sig = true  /* @op executor: SIGTERM: SystemExit in _reap_workers before this pid's "self._read_results(pids=[pid])" */
    :: terms < TERMS -> terms++; sig = true;  /* @op executor: SIGTERM: SystemExit in _reap_workers right after "self._outputs.pop(pid).close()" */
       read_output(w); hasout[w] = false
    :: terms < TERMS -> terms++; sig = true;  /* @op executor: SIGTERM: SystemExit in _reap_workers right after "self._inputs.pop(pid).close()" */
       read_output(w); hasout[w] = false; hasin[w] = false
    :: terms < TERMS -> terms++; sig = true;  /* @op executor: SIGTERM: SystemExit in _reap_workers right after "proc = self.workers.pop(pid)" (or "proc.join()") */
       read_output(w); hasout[w] = false; hasin[w] = false; inuse[w] = false
    fi
#endif
}

inline process_workloads() {
    /* _process_workloads, one block ("@_held_off()"): "self.sync()" */
    atomic {
        collect_all();
        reap_dead();
        i = 0; j = 0  /* @op executor: _process_workloads "self.sync()" */
    };
    /* "for workload in workload_list:" */
    do
    :: j == b -> break
    :: j < b ->
       ok = false;
       do  /* "while (pid := self._idle_worker()) is not None:" */
       :: d_step {
              /* "_idle_worker()" returns None: every worker busy or dead unreaped, "len(self.workers) >=
                 self.parallelism"; "else:" ... "return": what is left of the batch stays in BaseExecutor's queue */
              !HASIDLE && SLOTS_USED == N -> j = b; w = 0; k = 0  /* @op executor: _process_workloads "Every one of %d workers is busy; workloads wait for one" "return" */
          }; break
       :: atomic {
              /* "_idle_worker()": "if pid not in self._worker_tasks and not _exited(proc): return pid"; else with
                 fork "self._spawn_workers_with_gc_freeze(self.parallelism - len(self.workers))",
                 "return next(pid for pid in self.workers if pid not in before)" */
              HASIDLE || SLOTS_USED < N ->  /* @op executor: _process_workloads "while (pid := self._idle_worker()) is not None:" "self._send_workload(pid, workload)" */
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
              /* the batch's next workload is the front of BaseExecutor's queue: those before it were taken */
              k = sq[0];
              /* "self._send_workload(pid, workload)" starts the frame. No cyclic wait: the worker is idle, so
                 it has read all it was sent and waits for more */
              assert(plen[IN(w)] == 0 && owed[IN(w)] == 0);
              infr[w]!k; owed[IN(w)] = W; rem = W; i = 0
          };
          do  /* @wait executor: _send_workload "except BlockingIOError:" ... "time.sleep(0.001)": the input pipe is full (SIGTERM held off) */
          :: rem == 0 -> ok = true; break
          :: d_step { rem > 0 && !rgone[IN(w)] && WRITABLE(IN(w)) -> pipe_put(IN(w), rem, n); n = 0; owed[IN(w)] = rem }  /* @op executor: _send_workload "frame = frame[os.write(fd, frame) :]" */
          :: atomic {
                 /* EPIPE, or "if _exited(self.workers[pid]): raise BrokenPipeError(...)" while the pipe is full;
                    "self.workers[pid].kill()"; "except BrokenPipeError:" "self._reap_workers([pid])" (inside the
                    held-off block); the workload never left BaseExecutor's queue */
                 rem > 0 && rgone[IN(w)] ->  /* @op executor: _send_workload fails: BrokenPipeError, "self.workers[pid].kill()"; _process_workloads "self._reap_workers([pid])" */
                 if :: alive[w] -> sigkill(w) :: else fi;
                 assert(ranby[k] == 0 && !inrun[k]);
                 rem = 0;
                 reap(w);
                 w = 0; i = 0; k = 0; st = 0; n = 0
             }; break
          od;
          if
          :: ok -> break
          :: else
          fi
       od;
       if
       :: ok ->
          d_step {
              /* "self._take_queued(workload)"; "self.running.add(key)"; "self._newest[key] = workload";
                 "self._worker_tasks[pid] = key, workload"; "self._unstarted.add(pid)" */
              assert(sqn > 0 && sq[0] == k && !inrun[k] && outcome[k] == NONE);
              for (i : 1 .. K - 1) { sq[i - 1] = sq[i] }
              sq[K - 1] = 0; sqn--;
              inrun[k] = true; wkey[w] = k; unst[w] = ACKON;  /* @op executor: _process_workloads "self._take_queued(workload)" ... "self._worker_tasks[pid] = key, workload" */
              j++; ok = false; w = 0; k = 0; i = 0
          }
       :: else
       fi
    od;
    j = 0; w = 0; k = 0
}

inline sync_unheld() {
    /* heartbeat(): "self.sync()", held off only inside its blocks: "self._read_results()" (one block), then
       "self._reap_workers(dead)" (none), each "self._worker_died(pid, exitcode)" (one block) */
    atomic {
        sig = false;  /* @op executor: heartbeat "self.sync()" */
        if
        :: b > 0 && terms < TERMS -> terms++; sig = true  /* @op executor: SIGTERM: SystemExit right after _process_workloads' block */
        :: true -> collect_all()
        fi;
        for (i : 0 .. N - 1) {
            if
            :: !sig && inuse[i] && !alive[i] -> reap_unheld(i)
            :: else
            fi
        }
        i = 0; k = 0; st = 0; n = 0; b = 0
    };
    if
    :: sig -> goto sigterm
    :: else
    fi
}

inline heartbeat() {
    /* BaseExecutor.heartbeat: "open_slots = self.parallelism - len(self.running)"; "self.trigger_tasks(open_slots)":
       "if workload_list: self._process_workloads(workload_list)"; "self.sync()" */
    b = BATCH;  /* @op executor: heartbeat "open_slots = self.parallelism - len(self.running)"; "self.trigger_tasks(open_slots)" */
    if
    :: b > 0 -> process_workloads()
    :: else
    fi;
    sync_unheld()
}

inline send_pill(w) {
    /* end(): "with contextlib.suppress(OSError):" "self._send_workload(pid, None)": only the scheduler's
       thread writes, and none of its writes to a live worker was cut part way ("self.workers[pid].kill()" on
       a failure part way). "self._inputs[pid]" of a pid no longer in _inputs raises KeyError: asserted */
    d_step {
        assert(hasin[w]);
        if
        :: owed[IN(w)] > 0 -> corrupt[IN(w)] = true
        :: else
        fi;
        infr[w]!0; owed[IN(w)] = PILL; rem = PILL
    };
    do  /* @wait executor: end() _send_workload(pid, None) "time.sleep(0.001)": the input pipe is full */
    :: rem == 0 -> break
    :: d_step { rem > 0 && !rgone[IN(w)] && WRITABLE(IN(w)) -> pipe_put(IN(w), rem, n); n = 0; owed[IN(w)] = rem }  /* @op executor: end() "self._send_workload(pid, None)" writes */
    :: d_step { rem > 0 && rgone[IN(w)] -> if :: alive[w] -> sigkill(w) :: else fi }; break  /* @op executor: end() "self._send_workload(pid, None)" fails: BrokenPipeError, suppressed */
    od
}

/* The scheduler heartbeats every loop (and slots_available and slots_occupied run its reads): nothing
   a heartbeat looks at changes until a result or a dead worker is there, or a queued workload has an
   open slot and an idle worker or room to start one; the model waits for that (or for every other
   process to be stuck, Promela's timeout). */
#define HB_READY (SOMEREADY || (BATCH > 0 && (HASIDLE || SLOTS_USED < N)))

active proctype Executor() {
    byte w, k, st, i, n, rem, b, j;
    bool ok, sig;
    assert(RUNF <= PG && ACKF <= PG && R <= PG);  /* a result frame is smaller than PIPE_BUF */
    /* start(): "self._spawn_workers_with_gc_freeze(self.parallelism)" */
    atomic {
        for (i : 0 .. N - 1) { spawn(i) }
    };
    /* the scheduler: queue_workload for each: "self.queued_tasks[ti.key] = workload" (all of one priority) */
    d_step {
        for (i : 1 .. K) { sq[i - 1] = i }
        sqn = K; i = 0
    };
    /* the scheduler's loop: a heartbeat every loop until every key has ended */
    do  /* @wait executor: heartbeat: a result, a dead worker, or a queued workload with an open slot and a free worker */
    :: ALLENDED -> break
    :: !ALLENDED && HB_READY -> heartbeat()
    :: terms < TERMS -> terms++; goto sigterm  /* @op executor: SIGTERM: SystemExit between two heartbeats */
    :: timeout -> break  /* nothing can move any more: the scheduler stops the executor */
    od;
sigterm:
    /* the scheduler's exit calls end(). A step of its own: the `for` below begins with `i = 0`, which a
       goto to a label on it would skip */
    atomic { w = 0; k = 0; b = 0; j = 0 };  /* @op executor: end() "Shutting down LocalExecutor" */
    /* "for pid in list(self.workers):" */
    for (i : 0 .. N - 1) {
        if
        :: inuse[i] -> w = i; send_pill(w)  /* @op executor: end() "self._send_workload(pid, None)" */
        :: else
        fi
    }
    /* "while self.workers:" "multiprocessing.connection.wait([...], 0.1)"; "self.sync()" */
    do  /* @wait executor: end() "while self.workers:": a result or a dead worker */
    :: SLOTS_USED == 0 -> break
    :: SLOTS_USED > 0 && SOMEREADY -> atomic { collect_all(); reap_dead(); i = 0; k = 0; st = 0; n = 0 }  /* @op executor: end() "while self.workers:" "self.sync()" */
    od;
    /* end() has returned. What no worker took, or what went back because its worker died before starting
       it, is in BaseExecutor's queue for the scheduler: it never started */
    atomic {
        for (i : 0 .. K - 1) {
            if
            :: i < sqn ->
               k = sq[i];
               assert(outcome[k] == NONE && !inrun[k]);
               assert(ranby[k] == 0);  /* back in the scheduler's queue: never started */
               outcome[k] = QUEUED
            :: else
            fi
        }
    };  /* @op executor: end() has returned; BaseExecutor's queue keeps what waits */
end_done:
    /* every workload ended exactly once (end_dispatch asserts "once"): reported, failed, or queued */
    assert(ALLENDED)  /* @op executor: end() has returned */
}
