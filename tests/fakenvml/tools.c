/*
 * NVML functions that monitoring tools call beyond what the monitor itself
 * reads: nvitop (Device/GpuProcess snapshots), gpustat (new_query) and
 * jupyterlab-nvdashboard (its websocket handlers and import-time probes).
 * Without them those tools log or raise "Function Not Found".
 *
 * Each answers from the device's "tools" keys (README.md) and follows the
 * error rules documented in nvml.h: NULL out-pointers and out-of-range enums
 * are INVALID_ARGUMENT; a key the device file leaves out (or null) is
 * NOT_SUPPORTED, as on a GPU without that feature; MIG device handles support
 * none of these, and a GPU in MIG mode reports no encoder, decoder or
 * per-process utilisation (nvml.h: "On MIG-enabled GPUs, querying process
 * utilization is not currently supported").
 */
#define _GNU_SOURCE
#pragma GCC visibility push(default)
#include <nvml.h>
#pragma GCC visibility pop

#include "fakenvml.h"

#include <errno.h>
#include <string.h>
#include <time.h>

static long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Seconds since the library was loaded: NVLink data counters grow from there. */
static struct timespec g_loaded;

__attribute__((constructor)) static void tools_load(void)
{
    clock_gettime(CLOCK_MONOTONIC, &g_loaded);
}

double fk_seconds_loaded(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)(ts.tv_sec - g_loaded.tv_sec) + (double)(ts.tv_nsec - g_loaded.tv_nsec) / 1e9;
}

/* A plain unsigned value of a GPU (never of a MIG device); has == 0: NOT_SUPPORTED. */
static nvmlReturn_t gpu_uint(const char *fn, nvmlDevice_t device, unsigned int *out, size_t has_off,
                             size_t val_off)
{
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(fn, device, &d);
    if (rc)
        return rc;
    if (!out)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    const char *t = (const char *)&d.g->tools;
    if (d.m || !*(const int *)(t + has_off))
        return fk_leave(NVML_ERROR_NOT_SUPPORTED);
    *out = *(const unsigned int *)(t + val_off);
    return fk_leave(NVML_SUCCESS);
}

#define FK_TOOLS_UINT(has, val, out)                                                                         \
    gpu_uint(__func__, device, (unsigned int *)(out), offsetof(fk_tools, has), offsetof(fk_tools, val))

/* ------------------------------------------------- encoder and decoder -- */

static nvmlReturn_t codec_util(const char *fn, nvmlDevice_t device, unsigned int *util, unsigned int *period,
                               int decoder)
{
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(fn, device, &d);
    if (rc)
        return rc;
    if (!util || !period)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    const fk_tools *t = &d.g->tools;
    if (d.m || mig_enabled(d.g) || !(decoder ? t->has_dec : t->has_enc))
        return fk_leave(NVML_ERROR_NOT_SUPPORTED);
    *util = decoder ? t->dec_util : t->enc_util;
    *period = t->codec_period_us;
    return fk_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                             unsigned int *samplingPeriodUs)
{
    FK_COUNT();
    return codec_util(__func__, device, utilization, samplingPeriodUs, 0);
}

nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                             unsigned int *samplingPeriodUs)
{
    FK_COUNT();
    return codec_util(__func__, device, utilization, samplingPeriodUs, 1);
}

/* ---------------------------------------------- per-process utilisation -- */

/*
 * One sample per process (compute or graphics, each pid once) whose entry has
 * "sm_util". As documented: utilization NULL asks for the count (pynvml passes
 * *count 0 and expects INSUFFICIENT_SIZE); no sample newer than
 * lastSeenTimeStamp is NOT_FOUND.
 */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(__func__, device, &d);
    if (rc)
        return rc;
    if (!processSamplesCount)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (d.m || mig_enabled(d.g))
        return fk_leave(NVML_ERROR_NOT_SUPPORTED);
    long long stamp = now_us();
    const fk_proc *found[2 * FK_MAX_PROCS];
    unsigned n = 0;
    const fk_gpu *g = d.g;
    for (int list = 0; list < 2; list++) {
        const fk_proc *procs = list ? g->gprocs : g->procs;
        int count = list ? g->ngprocs : g->nprocs;
        for (int i = 0; i < count; i++) {
            int seen = 0;
            for (unsigned k = 0; k < n && !seen; k++)
                seen = found[k]->pid == procs[i].pid;
            if (procs[i].has_util && !seen)
                found[n++] = &procs[i];
        }
    }
    if (n == 0 || (unsigned long long)stamp <= lastSeenTimeStamp)
        return fk_leave(NVML_ERROR_NOT_FOUND);
    if (!utilization || *processSamplesCount < n) {
        *processSamplesCount = n;
        return fk_leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned i = 0; i < n; i++) {
        utilization[i].pid = found[i]->pid;
        utilization[i].timeStamp = (unsigned long long)stamp;
        utilization[i].smUtil = found[i]->sm_util;
        utilization[i].memUtil = found[i]->mem_util;
        utilization[i].encUtil = found[i]->enc_util;
        utilization[i].decUtil = found[i]->dec_util;
    }
    *processSamplesCount = n;
    return fk_leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ PCIe -- */

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen)
{
    FK_COUNT();
    return FK_TOOLS_UINT(has_pcie_max_gen, pcie_max_gen, maxLinkGen);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth)
{
    FK_COUNT();
    return FK_TOOLS_UINT(has_pcie_max_width, pcie_max_width, maxLinkWidth);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen)
{
    FK_COUNT();
    return FK_TOOLS_UINT(has_pcie_gen, pcie_gen, currLinkGen);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth)
{
    FK_COUNT();
    return FK_TOOLS_UINT(has_pcie_width, pcie_width, currLinkWidth);
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(__func__, device, &d);
    if (rc)
        return rc;
    if (!value || (unsigned)counter >= NVML_PCIE_UTIL_COUNT)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    const fk_tools *t = &d.g->tools;
    int tx = counter == NVML_PCIE_UTIL_TX_BYTES;
    if (d.m || !(tx ? t->has_pcie_tx : t->has_pcie_rx))
        return fk_leave(NVML_ERROR_NOT_SUPPORTED);
    *value = tx ? t->pcie_tx : t->pcie_rx;
    fk_leave(NVML_SUCCESS);
    /* nvml.h: "querying a byte counter over a 20ms interval"; driver 580 on an H100 took 20.7 to
       21.4 ms a call, of it about 1 ms CPU, and two calls from two threads overlap (recorded). The
       caller waits out the window here, without the lock: other calls go on meanwhile. */
    struct timespec window = {0, FK_PCIE_WINDOW_NS};
    while (nanosleep(&window, &window) == -1 && errno == EINTR)
        ;
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- NVLink -- */

nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(__func__, device, &d);
    if (rc)
        return rc;
    if (!version)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    const fk_tools *t = &d.g->tools;
    if (d.m || !t->has_nvlink || t->nvlink_links == 0)
        return fk_leave(NVML_ERROR_NOT_SUPPORTED);
    if (link >= t->nvlink_links)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    *version = t->nvlink_version;
    return fk_leave(NVML_SUCCESS);
}

/* NVML_FI_DEV_NVLINK_SPEED_MBPS_L<n> -> n, or -1 (the ids are not contiguous). */
static int speed_field_link(unsigned int id)
{
    if (id >= NVML_FI_DEV_NVLINK_SPEED_MBPS_L0 && id <= NVML_FI_DEV_NVLINK_SPEED_MBPS_L5)
        return (int)(id - NVML_FI_DEV_NVLINK_SPEED_MBPS_L0);
    if (id >= NVML_FI_DEV_NVLINK_SPEED_MBPS_L6 && id <= NVML_FI_DEV_NVLINK_SPEED_MBPS_L11)
        return 6 + (int)(id - NVML_FI_DEV_NVLINK_SPEED_MBPS_L6);
    return -1;
}

static void field_value(const fk_dev *d, nvmlFieldValue_t *v, long long stamp, double elapsed)
{
    const fk_tools *t = &d->g->tools;
    int links = d->m || !t->has_nvlink ? 0 : (int)t->nvlink_links;
    int speed_link = speed_field_link(v->fieldId);
    v->timestamp = stamp;
    v->latencyUsec = 0;
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    memset(&v->value, 0, sizeof v->value);
    v->nvmlReturn = NVML_SUCCESS;
    if (v->fieldId == 0 || v->fieldId >= NVML_FI_MAX) {
        v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
    } else if (v->fieldId == NVML_FI_DEV_ECC_CURRENT) {
        /* ECC mode, 1 = on: where "ecc_errors" says ECC is there (an H100 answers 1, recorded) */
        if (d->m || !t->has_ecc)
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        else
            v->value.ullVal = 1;
    } else if (links == 0) {
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; /* no NVLink (or a MIG device): no NVLink field */
    } else if (v->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT) {
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = (unsigned int)links;
    } else if (v->fieldId == NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON) {
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = t->nvlink_speed_mbps;
    } else if (speed_link >= 0) {
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        if (speed_link < links)
            v->value.uiVal = t->nvlink_speed_mbps;
        else
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    } else if (v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ||
               v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) {
        /* scopeId is the link; the counter (KiB) grows at the configured rate. */
        unsigned long long rate = v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ? t->nvlink_tx : t->nvlink_rx;
        if (v->scopeId >= (unsigned)links)
            v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        else
            v->value.ullVal = (unsigned long long)((double)rate * elapsed);
    } else {
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; /* a field the stand-in does not model */
    }
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(__func__, device, &d);
    if (rc)
        return rc;
    if (!values || valuesCount < 0)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    long long stamp = now_us();
    double elapsed = fk_seconds_loaded();
    for (int i = 0; i < valuesCount; i++)
        field_value(&d, &values[i], stamp, elapsed);
    return fk_leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ BAR1 -- */

nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(__func__, device, &d);
    if (rc)
        return rc;
    if (!bar1Memory)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    const fk_tools *t = &d.g->tools; /* a MIG device answers its parent's figures */
    if (!t->has_bar1)
        return fk_leave(NVML_ERROR_NOT_SUPPORTED);
    bar1Memory->bar1Total = t->bar1_total;
    bar1Memory->bar1Used = t->bar1_used < t->bar1_total ? t->bar1_used : t->bar1_total;
    bar1Memory->bar1Free = t->bar1_total - bar1Memory->bar1Used;
    return fk_leave(NVML_SUCCESS);
}

/* ------------------------------------------------- modes and ECC counts -- */

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    FK_COUNT();
    return FK_TOOLS_UINT(has_persistence, persistence, mode);
}

nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t *display)
{
    FK_COUNT();
    return FK_TOOLS_UINT(has_display_mode, display_mode, display);
}

nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, nvmlEnableState_t *isActive)
{
    FK_COUNT();
    return FK_TOOLS_UINT(has_display_active, display_active, isActive);
}

nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    FK_COUNT();
    return FK_TOOLS_UINT(has_pstate, pstate, pState);
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    FK_COUNT();
    return FK_TOOLS_UINT(has_compute_mode, compute_mode, mode);
}

/* The driver model is a Windows notion (WDDM/TCC): NOT_SUPPORTED on Linux. */
nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t device, nvmlDriverModel_t *current, nvmlDriverModel_t *pending)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(__func__, device, &d);
    if (rc)
        return rc;
    if (!current || !pending)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    return fk_leave(NVML_ERROR_NOT_SUPPORTED);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *eccCounts)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(__func__, device, &d);
    if (rc)
        return rc;
    if (!eccCounts || (unsigned)errorType >= NVML_MEMORY_ERROR_TYPE_COUNT ||
        (unsigned)counterType >= NVML_ECC_COUNTER_TYPE_COUNT)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    const fk_tools *t = &d.g->tools;
    if (d.m || !t->has_ecc)
        return fk_leave(NVML_ERROR_NOT_SUPPORTED); /* ECC off or not available */
    /* volatile and aggregate counts are the same: the stand-in never reboots */
    *eccCounts = errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED ? t->ecc_corrected : t->ecc_uncorrected;
    return fk_leave(NVML_SUCCESS);
}
