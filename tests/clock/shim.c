/* Test-only LD_PRELOAD shim: shifts the wall clock (gettimeofday and
 * clock_gettime(CLOCK_REALTIME*)) of the process it is preloaded into by the
 * signed number of milliseconds written in the file $XCLOAK_CLOCK_FILE, read
 * at every call, so a test can step a live server's clock backwards and
 * forwards. Monotonic clocks are left alone. The real clocks are read with raw
 * syscalls (no dlsym, so no recursion through the allocator at start-up). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_ms(void) {
    const char *path = getenv("XCLOAK_CLOCK_FILE");
    if (!path) return 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    char buf[32] = {0};
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    return n > 0 ? strtoll(buf, NULL, 10) : 0;
}

static void shift(long long *sec, long long *sub, long long per_sec, long long ms) {
    long long total = *sec * per_sec + *sub + ms * (per_sec / 1000);
    *sec = total / per_sec;
    *sub = total % per_sec;
    if (*sub < 0) { *sub += per_sec; *sec -= 1; }
}

int gettimeofday(struct timeval *tv, void *tz) {
    int rc = (int)syscall(SYS_gettimeofday, tv, tz);
    if (rc == 0 && tv) {
        long long sec = tv->tv_sec, usec = tv->tv_usec;
        shift(&sec, &usec, 1000000LL, offset_ms());
        tv->tv_sec = sec;
        tv->tv_usec = usec;
    }
    return rc;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int rc = (int)syscall(SYS_clock_gettime, clock, ts);
    if (rc == 0 && ts && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        long long sec = ts->tv_sec, nsec = ts->tv_nsec;
        shift(&sec, &nsec, 1000000000LL, offset_ms());
        ts->tv_sec = sec;
        ts->tv_nsec = nsec;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    if (out) *out = tv.tv_sec;
    return tv.tv_sec;
}
