/*
 * Device nodes: the permission side of a simulated GPU.
 *
 * A device in the file may name the character device that stands for it
 * ("device_node": "/dev/nvidia3", or a node a test made with mknod). The real
 * library opens /dev/nvidiaN when it hands out a handle for GPU N, so a
 * process that may not open that node (a device cgroup's "c 195:N" deny rule
 * answers EPERM, file modes EACCES) cannot talk to that GPU, while the GPU is
 * still counted. What the real library answers then, and where that is said:
 *
 *   - nvml.h (nvidia-nvml-dev), nvmlDeviceGetCount_v2: "returns count of all
 *     devices in the system even if nvmlDeviceGetHandleByIndex_v2 returns
 *     NVML_ERROR_NO_PERMISSION for such device"; nvmlDeviceGetHandleByIndex_v2
 *     and nvmlDeviceGetHandleByPciBusId_v2 return NVML_ERROR_NO_PERMISSION "if
 *     the user doesn't have permission to talk to this device".
 *   - NVIDIA/nvidia-docker#393: in a devices cgroup denying 2 of 4 GPUs,
 *     nvidia-smi lists the two allowed GPUs, and a tool that takes a handle for
 *     every counted GPU fails with "nvml: Insufficient Permissions".
 *
 * nvml.h does not list NO_PERMISSION for nvmlDeviceGetHandleByUUID; the
 * stand-in answers it for a fenced GPU's own UUID (and its MIG devices':
 * they are reached through the same node), since the device exists but may
 * not be opened, and keeps searching past it for any other UUID.
 *
 * The other outcomes of open():
 *   - ENXIO ("no such device or address"): the node exists and the fence let
 *     the open through, but no driver answers behind it, which is what a
 *     mknod'ed node on a machine without NVIDIA's kernel module gives. The
 *     node only stands for permission here, so this is success.
 *   - ENOENT: no such node. The real library (as root) first creates missing
 *     nodes with nvidia-modprobe; the stand-in does not, and answers
 *     NVML_ERROR_NOT_FOUND, the code nvml.h gives for a device that is not
 *     there.
 *   - anything else: NVML_ERROR_UNKNOWN ("on any unexpected error").
 *
 * The node is opened (read-write, as the driver's clients do) and closed at
 * each handle request, so a fence set up after nvmlInit is honoured at once.
 */
#define _GNU_SOURCE
#include "fakenvml.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

nvmlReturn_t fk_node_access(const fk_gpu *g)
{
    if (!g->device_node[0])
        return NVML_SUCCESS;
    int fd = open(g->device_node, O_RDWR | O_CLOEXEC | O_NOCTTY);
    if (fd >= 0) {
        close(fd);
        return NVML_SUCCESS;
    }
    switch (errno) {
    case ENXIO:
        return NVML_SUCCESS;
    case EPERM:
    case EACCES:
        return NVML_ERROR_NO_PERMISSION;
    case ENOENT:
        return NVML_ERROR_NOT_FOUND;
    default:
        return NVML_ERROR_UNKNOWN;
    }
}
