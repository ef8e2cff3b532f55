/*
 * Pipes as Linux's fs/pipe.c treats them, shared by every stage's model.
 *
 * Sizes are in units of half a page (PG units make a page, SLOTS pages make a pipe: the real pipe is
 * 16 pages of 4 KiB). A pipe keeps its bytes in whole pages: the reader frees a page only once it has
 * consumed all of it, and a writer appends to the last page while it has room, otherwise it needs a
 * free page. So a blocked writer of a frame larger than what is free only moves once a whole page is
 * free, however much the reader has read of the first one. Frames larger than the pipe are written
 * in pieces, one page per step; a reader may run between any two of them.
 *
 * A process killed with SIGKILL stops at whatever step it was at (`unless` in each proctype); what it
 * held stays held: a lock it owned is never released, a frame it was writing stays half written.
 */

#ifndef PG
#define PG 2
#endif
#ifndef SLOTS
#define SLOTS 2
#endif

/* the pipe's bytes occupy pages poff.. (poff + plen) of its ring: poff is how far the reader is into
   the first one */
#define PAGES(p) ((poff[p] + plen[p] + PG - 1) / PG)
#define ROOM(p) ((plen[p] > 0 && ((poff[p] + plen[p]) % PG) != 0) -> (PG - ((poff[p] + plen[p]) % PG)) : 0)
#define WRITABLE(p) (ROOM(p) > 0 || PAGES(p) < SLOTS)

/* One step of pipe_write: fill the last page, or take a free one. Callers guard with WRITABLE(p). */
inline pipe_put(p, rem, n) {
    n = ROOM(p);
    if
    :: n == 0 -> n = PG
    :: else
    fi;
    if
    :: n > rem -> n = rem
    :: else
    fi;
    plen[p] = plen[p] + n;
    rem = rem - n
}

/* One step of pipe_read for a reader that wants `want` more units: at most up to the end of the first
   page, which is freed (poff back to 0) once consumed. Callers guard with plen[p] > 0. */
inline pipe_take(p, want, n) {
    n = PG - poff[p];
    if
    :: n > plen[p] -> n = plen[p]
    :: else
    fi;
    if
    :: n > want -> n = want
    :: else
    fi;
    plen[p] = plen[p] - n;
    poff[p] = (poff[p] + n) % PG;
    if
    :: plen[p] == 0 -> poff[p] = 0
    :: else
    fi;
    want = want - n
}

/* Worker phases, for the killer's choice of when to strike (KILLMASK: a bit per phase). */
#define PH_IDLE 0      /* waiting for a workload: blocked on the read lock, or in the pipe read */
#define PH_READ 1      /* part way through reading a workload frame */
#define PH_RUN 2       /* holds a workload, writing its running frame or running it */
#define PH_WRITE 3     /* part way through writing its terminal result frame */
#define PH_LOCKS 4     /* holding a lock without any pipe I/O (unread_messages) */
#ifndef KILLMASK
#define KILLMASK 31
#endif
#define KILLABLE(w) (((KILLMASK >> phase[w]) & 1) == 1)

/* Outcome of a key. */
#define NONE 0
#define SUCCESS 1      /* run and reported by the worker that ran it */
#define FAILED 2       /* failed by the executor: the worker that held it died */
#define QUEUED 3       /* given back to the scheduler's queue, never started */

/* States a worker reports. */
#define ST_TOOK 1      /* stage 3: "took the workload" (state None) */
#define ST_RUNNING 2
#define ST_DONE 3
