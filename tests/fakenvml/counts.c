/*
 * Call counters shared between processes.
 *
 * When FAKENVML_COUNTS names a file, every exported NVML function adds one to
 * its record in that file. The file is a fixed table of FK_COUNT_RECORDS
 * records of 72 bytes, { char name[64]; uint64_t count; } in host byte order,
 * mapped MAP_SHARED, so any number of processes (and a reader such as
 * tests/fakenvml read_counts()) see the same counters live.
 *
 * A function's record is found by open addressing on a hash of its name.
 * A free record (first 8 name bytes zero) is claimed with a compare-and-swap
 * of those 8 bytes to FK_CLAIMING; the claimer writes the rest of the name
 * and then publishes its first 8 bytes. Counts are atomic increments.
 */
#define _GNU_SOURCE
#include "fakenvml.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define FK_COUNT_RECORDS 512
#define FK_CLAIMING 0xFFFFFFFFFFFFFFFFull
#define FK_CLAIM_SPINS 1000000

typedef union {
    char name[64];
    uint64_t w[8];
} fk_name;

struct fk_counter {
    fk_name name;
    uint64_t count;
};

_Static_assert(sizeof(struct fk_counter) == 72, "record layout is part of the file format");

static struct fk_counter *g_table;          /* NULL: counting is off */
static struct fk_counter g_off;             /* cached by functions that do not count */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void open_table(void)
{
    const char *path = getenv("FAKENVML_COUNTS");
    if (!path || !*path)
        return;
    size_t size = FK_COUNT_RECORDS * sizeof(struct fk_counter);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        perror("fakenvml: FAKENVML_COUNTS");
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (st.st_size < (off_t)size && ftruncate(fd, (off_t)size) != 0)) {
        perror("fakenvml: FAKENVML_COUNTS");
        close(fd);
        return;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        perror("fakenvml: FAKENVML_COUNTS mmap");
        return;
    }
    g_table = p;
}

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static struct fk_counter *find_or_claim(const char *fn)
{
    fk_name key;
    memset(&key, 0, sizeof key);
    strncpy(key.name, fn, sizeof key.name - 1);
    if (key.w[0] == 0 || key.w[0] == FK_CLAIMING)
        return NULL;

    uint64_t start = hash_name(key.name) % FK_COUNT_RECORDS;
    for (unsigned probe = 0; probe < FK_COUNT_RECORDS; probe++) {
        struct fk_counter *r = &g_table[(start + probe) % FK_COUNT_RECORDS];
        for (long spins = 0;; spins++) {
            uint64_t w0 = __atomic_load_n(&r->name.w[0], __ATOMIC_ACQUIRE);
            if (w0 == 0) {
                uint64_t expected = 0;
                if (__atomic_compare_exchange_n(&r->name.w[0], &expected, FK_CLAIMING, 0,
                                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                    for (int k = 1; k < 8; k++)
                        __atomic_store_n(&r->name.w[k], key.w[k], __ATOMIC_RELAXED);
                    __atomic_store_n(&r->name.w[0], key.w[0], __ATOMIC_RELEASE);
                    return r;
                }
                continue; /* someone else claimed it: look again */
            }
            if (w0 == FK_CLAIMING) {
                if (spins > FK_CLAIM_SPINS)
                    break; /* a claimer died half-way: skip the record */
                sched_yield();
                continue;
            }
            int same = w0 == key.w[0];
            for (int k = 1; same && k < 8; k++)
                same = __atomic_load_n(&r->name.w[k], __ATOMIC_RELAXED) == key.w[k];
            if (same)
                return r;
            break; /* another function's record: next probe */
        }
    }
    return NULL; /* table full */
}

void fk_count(const char *fn, fk_counter **cache)
{
    struct fk_counter *c = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (!c) {
        pthread_once(&g_once, open_table);
        c = g_table ? find_or_claim(fn) : NULL;
        if (!c)
            c = &g_off;
        __atomic_store_n(cache, c, __ATOMIC_RELEASE);
    }
    if (c != &g_off)
        __atomic_fetch_add(&c->count, 1, __ATOMIC_RELAXED);
}
