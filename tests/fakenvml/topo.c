/*
 * Topology: how GPUs of one host reach each other and which CPUs sit next to
 * them, answered from the "topology" keys (README.md) as nvml.h documents:
 *
 *   nvmlDeviceGetTopologyCommonAncestor   PCIe path -> SINGLE/MULTIPLE/HOSTBRIDGE,
 *                                         then NUMA node -> NODE, else SYSTEM
 *   nvmlDeviceGetNvLinkState              per link: active or not
 *   nvmlDeviceGetNvLinkRemotePciInfo_v2   the peer GPU's (or NVSwitch's) PCI location
 *   nvmlDeviceGetNvLinkRemoteDeviceType   GPU or SWITCH
 *   nvmlDeviceGetNvLinkUtilizationCounter (deprecated) rx/tx counters per link
 *   nvmlDeviceGetCpuAffinity(WithinScope) the NUMA node's (or socket's) CPUs
 *   nvmlDeviceGetMemoryAffinity           the NUMA node (or the socket's nodes)
 *   nvmlDeviceGetNumaNodeId               only where the GPU is itself a NUMA node
 *
 * Errors: NULL out-pointers, a zero set size, a bad scope, counter or a link at
 * or past the GPU's link count are INVALID_ARGUMENT; NVLink calls on a GPU
 * without NVLink (a T4, a PCIe card) and affinity calls on a GPU without
 * "numa_node" are NOT_SUPPORTED. MIG device handles answer their parent's
 * affinity and NOT_SUPPORTED to the NVLink and common-ancestor calls.
 */
#define _GNU_SOURCE
#pragma GCC visibility push(default)
#include <nvml.h>
#pragma GCC visibility pop

#include "fakenvml.h"

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------- PCIe tree -- */

/* Number of leading "/"-separated elements two PCIe paths share, and their lengths. */
static int common_elements(const char *a, const char *b, int *na, int *nb)
{
    int common = 0, same = 1;
    *na = *nb = 0;
    if (!*a || !*b)
        return 0;
    for (;;) {
        size_t la = strcspn(a, "/"), lb = strcspn(b, "/");
        (*na)++;
        (*nb)++;
        same = same && la == lb && strncmp(a, b, la) == 0;
        if (same)
            common++;
        a += la;
        b += lb;
        if (!*a || !*b)
            break;
        a++;
        b++;
    }
    for (; *a; a++)
        *na += *a == '/';
    for (; *b; b++)
        *nb += *b == '/';
    return common;
}

static nvmlGpuTopologyLevel_t common_ancestor(const fk_gpu *x, const fk_gpu *y)
{
    int nx, ny, common = common_elements(x->pcie_path, y->pcie_path, &nx, &ny);
    if (common >= 2 && common == nx && common == ny)
        return NVML_TOPOLOGY_SINGLE; /* the same PCIe switch */
    if (common >= 2)
        return NVML_TOPOLOGY_MULTIPLE; /* switches below one switch, no host bridge crossed */
    if (common == 1)
        return NVML_TOPOLOGY_HOSTBRIDGE;
    if (x->has_numa && y->has_numa && x->numa_node >= 0 && x->numa_node == y->numa_node)
        return NVML_TOPOLOGY_NODE;
    return NVML_TOPOLOGY_SYSTEM;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 nvmlGpuTopologyLevel_t *pathInfo)
{
    FK_COUNT();
    fk_dev a, b;
    nvmlReturn_t rc = fk_enter_device(__func__, device1, &a);
    if (rc)
        return rc;
    rc = fk_resolve_other(__func__, device2, &b);
    if (rc)
        return fk_leave(rc);
    if (!pathInfo)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (a.m || b.m)
        return fk_leave(NVML_ERROR_NOT_SUPPORTED);
    /* A GPU with itself: driver 580 answers NOT_SUPPORTED (recorded). NVML_TOPOLOGY_INTERNAL
       is for two GPUs on one board (a K80), which the device file does not describe. */
    if (a.g == b.g)
        return fk_leave(NVML_ERROR_NOT_SUPPORTED);
    *pathInfo = common_ancestor(a.g, b.g);
    return fk_leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------- NVLink -- */

/* Enters, checks the GPU has NVLink and the link exists. Unlocks on failure. */
static nvmlReturn_t enter_link(const char *fn, nvmlDevice_t device, unsigned int link, const void *out, fk_dev *d)
{
    nvmlReturn_t rc = fk_enter_device(fn, device, d);
    if (rc)
        return rc;
    const fk_tools *t = &d->g->tools;
    if (d->m || !t->has_nvlink || t->nvlink_links == 0)
        rc = NVML_ERROR_NOT_SUPPORTED;
    else if (!out || link >= t->nvlink_links)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    return rc ? fk_leave(rc) : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = enter_link(__func__, device, link, isActive, &d);
    if (rc)
        return rc;
    *isActive = d.g->link_peer[link] == FK_LINK_OFF ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
    return fk_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = enter_link(__func__, device, link, pci, &d);
    if (rc)
        return rc;
    int peer = d.g->link_peer[link];
    if (peer == FK_LINK_OFF)
        return fk_leave(NVML_ERROR_NOT_SUPPORTED); /* nothing at the other end of an inactive link */
    const fk_config *cfg = fk_current();
    unsigned dom, bus, dev, device_id = 0;
    const char *bus_id;
    if (peer <= FK_LINK_SWITCH_BASE) {
        int s = FK_LINK_SWITCH_BASE - peer;
        dom = cfg->nvswitch[s].domain;
        bus = cfg->nvswitch[s].bus;
        dev = cfg->nvswitch[s].device;
        bus_id = cfg->nvswitch[s].bus_id;
    } else {
        const fk_gpu *p = &cfg->gpu[peer];
        dom = p->pci_domain;
        bus = p->pci_bus;
        dev = p->pci_device;
        bus_id = p->pci_bus_id;
        device_id = p->pci_device_id;
    }
    memset(pci, 0, sizeof *pci); /* pciSubSystemId is not filled, as documented */
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, dom & 0xffff, bus, dev);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = device_id;
    return fk_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                 nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = enter_link(__func__, device, link, pNvLinkDeviceType, &d);
    if (rc)
        return rc;
    int peer = d.g->link_peer[link];
    *pNvLinkDeviceType = peer == FK_LINK_OFF            ? NVML_NVLINK_DEVICE_TYPE_UNKNOWN
                         : peer <= FK_LINK_SWITCH_BASE ? NVML_NVLINK_DEVICE_TYPE_SWITCH
                                                       : NVML_NVLINK_DEVICE_TYPE_GPU;
    return fk_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkUtilizationCounter(nvmlDevice_t device, unsigned int link, unsigned int counter,
                                                   unsigned long long *rxcounter, unsigned long long *txcounter)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = enter_link(__func__, device, link, rxcounter, &d);
    if (rc)
        return rc;
    if (!txcounter || counter > 1)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    /* The same counters as the NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_* fields (KiB), on active links. */
    double elapsed = d.g->link_peer[link] == FK_LINK_OFF ? 0.0 : fk_seconds_loaded();
    *rxcounter = (unsigned long long)((double)d.g->tools.nvlink_rx * elapsed);
    *txcounter = (unsigned long long)((double)d.g->tools.nvlink_tx * elapsed);
    return fk_leave(NVML_SUCCESS);
}

/* -------------------------------------------------------------- affinity -- */

/* The CPUs (or, nodes != 0, the NUMA nodes) near the GPU within scope, as a bitmask. */
static void near_set(const fk_config *cfg, const fk_gpu *g, nvmlAffinityScope_t scope, int nodes,
                     unsigned long out[FK_CPU_WORDS])
{
    memset(out, 0, FK_CPU_WORDS * sizeof out[0]);
    for (int n = 0; n < cfg->nnuma; n++) {
        /* numa_node -1: the platform has no NUMA information; every node counts */
        int in = g->numa_node < 0 ||
                 (scope == NVML_AFFINITY_SCOPE_NODE ? n == g->numa_node
                                                    : cfg->numa[n].socket == cfg->numa[g->numa_node].socket);
        if (!in)
            continue;
        if (nodes)
            out[n / 64] |= 1UL << (n % 64);
        else
            for (int w = 0; w < FK_CPU_WORDS; w++)
                out[w] |= cfg->numa[n].cpus[w];
    }
}

static nvmlReturn_t affinity(const char *fn, nvmlDevice_t device, unsigned int size, unsigned long *set,
                             nvmlAffinityScope_t scope, int nodes)
{
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(fn, device, &d);
    if (rc)
        return rc;
    if (!set || size == 0 || scope > NVML_AFFINITY_SCOPE_SOCKET)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!d.g->has_numa)
        return fk_leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned long all[FK_CPU_WORDS];
    near_set(fk_current(), d.g, scope, nodes, all);
    for (unsigned int w = 0; w < size; w++)
        set[w] = w < FK_CPU_WORDS ? all[w] : 0;
    return fk_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet,
                                                 nvmlAffinityScope_t scope)
{
    FK_COUNT();
    return affinity(__func__, device, cpuSetSize, cpuSet, scope, 0);
}

nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet)
{
    FK_COUNT();
    return affinity(__func__, device, cpuSetSize, cpuSet, NVML_AFFINITY_SCOPE_NODE, 0);
}

nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize, unsigned long *nodeSet,
                                         nvmlAffinityScope_t scope)
{
    FK_COUNT();
    return affinity(__func__, device, nodeSetSize, nodeSet, scope, 1);
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    FK_COUNT();
    fk_dev d;
    nvmlReturn_t rc = fk_enter_device(__func__, device, &d);
    if (rc)
        return rc;
    if (!node)
        return fk_leave(NVML_ERROR_INVALID_ARGUMENT);
    /* nvml.h: "This only applies to platforms where the GPUs are NUMA nodes." */
    if (!d.g->has_gpu_numa)
        return fk_leave(NVML_ERROR_NOT_SUPPORTED);
    *node = d.g->gpu_numa_node;
    return fk_leave(NVML_SUCCESS);
}
