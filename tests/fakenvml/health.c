/*
 * GPU health: XID events (nvmlEventSet*), double-bit ECC events and row
 * remapping (nvmlDeviceGetRemappedRows). See README.md, "Health".
 *
 * A device's "xid_events" list is the history of critical XIDs the GPU raised;
 * a test appends one (write_config) to inject it. An event set delivers what
 * was raised after the device was registered in it, one event per wait, in
 * order, and a double-bit ECC event each time "ecc_errors.uncorrected" grows.
 * A GPU that fell off the bus ("faults": {"*": "GPU_IS_LOST"}) answers every
 * call with GPU_IS_LOST, as in api.c.
 */
#define _GNU_SOURCE
#pragma GCC visibility push(default)
#include <nvml.h>
#pragma GCC visibility pop

#include "fakenvml.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What an H100 on driver 580.159.04 answers to nvmlDeviceGetSupportedEventTypes (checked 2026-11-26);
 * a GPU without ECC is taken to lack the memory-error events. Only XIDs and double-bit ECC errors fire. */
#define FK_EVENTS_H100 0xFF9FULL
#define FK_ECC_EVENTS                                                                                         \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeSingleBitEccErrorStorm |  \
     nvmlEventTypeDramRetirementEvent | nvmlEventTypeDramRetirementFailure)
#define FK_WAIT_STEP_MS 20 /* how often a wait looks at the device file again */

/* ---------------------------------------------------------------- parse -- */

static int bad(char *err, size_t errlen, const char *where, const char *what)
{
    snprintf(err, errlen, "%s.%s", where, what);
    return -1;
}

static int count_of(const cJSON *it, unsigned long long max, unsigned long long *out)
{
    if (cJSON_IsBool(it)) {
        *out = cJSON_IsTrue(it) ? 1 : 0;
        return 0;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > (double)max ||
        it->valuedouble != floor(it->valuedouble))
        return -1;
    *out = (unsigned long long)it->valuedouble;
    return 0;
}

int fk_health_parse(const cJSON *d, const char *where, fk_health *h, char *err, size_t errlen)
{
    memset(h, 0, sizeof *h);
    const cJSON *xids = cJSON_GetObjectItemCaseSensitive(d, "xid_events");
    if (xids && !cJSON_IsNull(xids)) {
        if (!cJSON_IsArray(xids))
            return bad(err, errlen, where, "xid_events must be a list of XID numbers");
        const cJSON *x;
        cJSON_ArrayForEach(x, xids)
        {
            if (h->nxid == FK_MAX_XIDS)
                return bad(err, errlen, where, "xid_events: at most 64");
            if (count_of(x, 0xFFFFFFFFull, &h->xid[h->nxid]) || cJSON_IsBool(x))
                return bad(err, errlen, where, "xid_events must be a list of XID numbers");
            h->nxid++;
        }
    }
    const cJSON *rr = cJSON_GetObjectItemCaseSensitive(d, "remapped_rows");
    if (rr && !cJSON_IsNull(rr)) {
        if (!cJSON_IsObject(rr))
            return bad(err, errlen, where, "remapped_rows must be an object {correctable, uncorrectable, pending, failure}");
        static const char *keys[] = {"correctable", "uncorrectable", "pending", "failure"};
        unsigned int *dst[] = {&h->remap_corr, &h->remap_unc, &h->remap_pending, &h->remap_failure};
        for (int i = 0; i < 4; i++) {
            const cJSON *it = cJSON_GetObjectItemCaseSensitive(rr, keys[i]);
            unsigned long long v = 0;
            if (it && !cJSON_IsNull(it) && count_of(it, i < 2 ? 0xFFFFFFFFull : 1, &v))
                return bad(err, errlen, where, "remapped_rows: counts >= 0, pending and failure true/false");
            *dst[i] = (unsigned int)v;
        }
        h->has_remap = 1;
    }
    return 0;
}

/* ------------------------------------------------------------ row remap -- */

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(__func__, device, &d);
    if (rc)
        return rc;
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    const fk_health *h = &d.g->health;
    if (d.m || !h->has_remap)
        return fk_leave(NVML_ERROR_NOT_SUPPORTED); /* pre-Ampere GPUs and MIG handles */
    *corrRows = h->remap_corr;
    *uncRows = h->remap_unc;
    *isPending = h->remap_pending;
    *failureOccurred = h->remap_failure;
    return fk_leave(NVML_SUCCESS);
}

/* --------------------------------------------------------------- events -- */

typedef struct {
    nvmlDevice_t device; /* the handle registered, given back in the event data */
    unsigned int slot;   /* host slot of its GPU */
    unsigned long long mask;
    int xid_seen;                  /* entries of xid_events already delivered */
    unsigned long long ecc_seen;   /* uncorrected ECC count already reported */
} fk_reg;

struct nvmlEventSet_st {
    int nreg;
    fk_reg reg[FK_MAX_GPUS];
};

static unsigned long long supported(const fk_gpu *g)
{
    return g->tools.has_ecc ? FK_EVENTS_H100 : (FK_EVENTS_H100 & ~FK_ECC_EVENTS);
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    FK_COUNT();
    nvmlReturn_t rc = fk_enter_lib(__func__);
    if (rc)
        return rc;
    if (!set)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    *set = calloc(1, sizeof(struct nvmlEventSet_st));
    return fk_leave(*set ? NVML_SUCCESS : NVML_ERROR_MEMORY);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    FK_COUNT();
    nvmlReturn_t rc = fk_enter_lib(__func__);
    if (rc)
        return rc;
    if (!set)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    free(set);
    return fk_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(__func__, device, &d);
    if (rc)
        return rc;
    if (!eventTypes)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    *eventTypes = d.m ? 0 : supported(d.g);
    return fk_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(__func__, device, &d);
    if (rc)
        return rc;
    if (!set)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    /* nvml.h: NOT_SUPPORTED when "some of requested event types" are not supported */
    if (d.m || (eventTypes & ~supported(d.g)))
        return fk_leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned int slot = (unsigned int)(d.g - fk_current()->gpu);
    fk_reg *r = NULL;
    for (int i = 0; i < set->nreg; i++)
        if (set->reg[i].slot == slot)
            r = &set->reg[i];
    if (!r) {
        r = &set->reg[set->nreg++];
        r->slot = slot;
        r->mask = 0;
        r->xid_seen = d.g->health.nxid; /* only what happens from now on */
        r->ecc_seen = d.g->tools.ecc_uncorrected;
    }
    r->device = device;
    r->mask |= eventTypes;
    return fk_leave(NVML_SUCCESS);
}

/* With the lock held: the next event of the set, 1 if one was found. */
static int next_event(nvmlEventSet_t set, nvmlEventData_t *data)
{
    const fk_config *cfg = fk_current();
    for (int i = 0; i < set->nreg; i++) {
        fk_reg *r = &set->reg[i];
        if ((int)r->slot >= cfg->ngpus || !cfg->gpu[r->slot].visible)
            continue;
        const fk_gpu *g = &cfg->gpu[r->slot];
        if (fk_fault_lookup(&g->faults, "nvmlEventSetWait") == NVML_ERROR_GPU_IS_LOST)
            continue; /* a GPU off the bus raises nothing more */
        memset(data, 0, sizeof *data);
        data->device = r->device;
        data->gpuInstanceId = data->computeInstanceId = FK_NA_U32;
        if (r->xid_seen > g->health.nxid)
            r->xid_seen = g->health.nxid; /* the history was rewritten: start again from it */
        if (r->xid_seen < g->health.nxid) {
            unsigned long long xid = g->health.xid[r->xid_seen++];
            if (r->mask & nvmlEventTypeXidCriticalError) {
                data->eventType = nvmlEventTypeXidCriticalError;
                data->eventData = xid;
                return 1;
            }
        }
        if (g->tools.ecc_uncorrected != r->ecc_seen) {
            int grew = g->tools.ecc_uncorrected > r->ecc_seen;
            r->ecc_seen = g->tools.ecc_uncorrected;
            if (grew && (r->mask & nvmlEventTypeDoubleBitEccError)) {
                data->eventType = nvmlEventTypeDoubleBitEccError;
                return 1;
            }
        }
    }
    return 0;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    FK_COUNT();
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        nvmlReturn_t rc = fk_enter_lib(__func__);
        if (rc)
            return rc;
        if (!set || !data)
            return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
        if (next_event(set, data))
            return fk_leave(NVML_SUCCESS);
        fk_leave(NVML_SUCCESS);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long waited = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (waited >= (long)timeoutms)
            return NVML_ERROR_TIMEOUT;
        long step = (long)timeoutms - waited < FK_WAIT_STEP_MS ? (long)timeoutms - waited : FK_WAIT_STEP_MS;
        struct timespec ts = {0, step * 1000000L};
        nanosleep(&ts, NULL);
    }
}
