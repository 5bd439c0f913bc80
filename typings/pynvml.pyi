# Types for the part of nvidia-ml-py (`pynvml`, which ships none) that kubegpu uses: the functions the
# plugin and tools call, the constants, error classes and ctypes structs they touch. It is also the API
# surface the fake NVML (kubegpu.node.nvml.fake) claims; tests/node/test_pynvml_stub.py checks this file
# against the installed pynvml and the fake against this file. Add a name here when code starts using it.
# Signatures are pynvml's, parameter names included. Its printable structs read char fields as str and
# take str or bytes.

from _ctypes import _CArgObject
from ctypes import Array, Structure, _Pointer, c_ubyte, c_uint
from typing import Self, TypeAlias

# -- return codes and constants ---------------------------------------------------------------------

NVML_SUCCESS: int
NVML_ERROR_UNINITIALIZED: int
NVML_ERROR_INVALID_ARGUMENT: int
NVML_ERROR_NOT_SUPPORTED: int
NVML_ERROR_NO_PERMISSION: int
NVML_ERROR_NOT_FOUND: int
NVML_ERROR_INSUFFICIENT_POWER: int
NVML_ERROR_INSUFFICIENT_RESOURCES: int
NVML_ERROR_INSUFFICIENT_SIZE: int
NVML_ERROR_IN_USE: int
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: int
NVML_ERROR_DRIVER_NOT_LOADED: int
NVML_ERROR_TIMEOUT: int
NVML_ERROR_IRQ_ISSUE: int
NVML_ERROR_LIBRARY_NOT_FOUND: int
NVML_ERROR_FUNCTION_NOT_FOUND: int
NVML_ERROR_GPU_IS_LOST: int
NVML_ERROR_RESET_REQUIRED: int
NVML_ERROR_OPERATING_SYSTEM: int
NVML_ERROR_LIB_RM_VERSION_MISMATCH: int
NVML_ERROR_UNKNOWN: int

NVML_FEATURE_DISABLED: int
NVML_FEATURE_ENABLED: int
NVML_DEVICE_MIG_DISABLE: int
NVML_DEVICE_MIG_ENABLE: int
NVML_DEVICE_ARCH_KEPLER: int
NVML_DEVICE_ARCH_MAXWELL: int
NVML_DEVICE_ARCH_PASCAL: int
NVML_DEVICE_ARCH_VOLTA: int
NVML_DEVICE_ARCH_TURING: int
NVML_DEVICE_ARCH_AMPERE: int
NVML_DEVICE_ARCH_ADA: int
NVML_DEVICE_ARCH_HOPPER: int
NVML_DEVICE_ARCH_BLACKWELL: int
NVML_DEVICE_ARCH_UNKNOWN: int
NVML_BRAND_UNKNOWN: int
NVML_BRAND_QUADRO: int
NVML_BRAND_TESLA: int
NVML_BRAND_NVS: int
NVML_BRAND_GRID: int
NVML_BRAND_GEFORCE: int
NVML_BRAND_TITAN: int
NVML_BRAND_NVIDIA_VAPPS: int
NVML_BRAND_NVIDIA_VPC: int
NVML_BRAND_NVIDIA_VCS: int
NVML_BRAND_NVIDIA_VWS: int
NVML_BRAND_NVIDIA_CLOUD_GAMING: int
NVML_BRAND_QUADRO_RTX: int
NVML_BRAND_NVIDIA_RTX: int
NVML_BRAND_NVIDIA: int
NVML_BRAND_GEFORCE_RTX: int
NVML_BRAND_TITAN_RTX: int
NVML_GPU_INSTANCE_PROFILE_COUNT: int
NVML_NVLINK_MAX_LINKS: int
NVML_NVLINK_DEVICE_TYPE_GPU: int
NVML_NVLINK_DEVICE_TYPE_SWITCH: int
NVML_MEMORY_ERROR_TYPE_CORRECTED: int
NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int
NVML_GPU_FABRIC_STATE_COMPLETED: int

NVML_TOPOLOGY_INTERNAL: int
NVML_TOPOLOGY_SINGLE: int
NVML_TOPOLOGY_MULTIPLE: int
NVML_TOPOLOGY_HOSTBRIDGE: int
NVML_TOPOLOGY_NODE: int
NVML_TOPOLOGY_SYSTEM: int

nvmlEventTypeSingleBitEccError: int
nvmlEventTypeDoubleBitEccError: int
nvmlEventTypePState: int
nvmlEventTypeXidCriticalError: int
nvmlEventTypeClock: int

nvmlGpuFabricInfo_v2: int
NVML_TEMPERATURE_GPU: int
NVML_CLOCK_SM: int

# -- errors: NVMLError(code) builds the subclass for the code ---------------------------------------

class NVMLError(Exception):
    value: int
    def __new__(cls, value: int) -> Self: ...

class NVMLError_NotSupported(NVMLError): ...
class NVMLError_Timeout(NVMLError): ...
class NVMLError_GpuIsLost(NVMLError): ...
class NVMLError_LibraryNotFound(NVMLError): ...

# -- handles ----------------------------------------------------------------------------------------

class struct_c_nvmlDevice_t(Structure): ...
class struct_c_nvmlGpuInstance_t(Structure): ...
class struct_c_nvmlEventSet_t(Structure): ...
class struct_c_nvmlComputeInstance_t(Structure): ...

c_nvmlDevice_t: TypeAlias = _Pointer[struct_c_nvmlDevice_t]
c_nvmlGpuInstance_t: TypeAlias = _Pointer[struct_c_nvmlGpuInstance_t]
c_nvmlEventSet_t: TypeAlias = _Pointer[struct_c_nvmlEventSet_t]
c_nvmlComputeInstance_t: TypeAlias = _Pointer[struct_c_nvmlComputeInstance_t]

# -- structs ----------------------------------------------------------------------------------------

class _PrintableStructure(Structure): ...

class _Chars:  # a char array field of a printable struct
    def __get__(self, obj: object, owner: type | None = None) -> str: ...
    def __set__(self, obj: object, value: str | bytes) -> None: ...

class c_nvmlMemory_t(_PrintableStructure):
    total: int
    free: int
    used: int

class c_nvmlMemory_v2_t(_PrintableStructure):
    version: int
    total: int
    reserved: int
    free: int
    used: int

class nvmlPciInfo_t(_PrintableStructure):
    busIdLegacy: _Chars
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int
    busId: _Chars

class c_nvmlDeviceAttributes(Structure):
    multiprocessorCount: int
    sharedCopyEngineCount: int
    sharedDecoderCount: int
    sharedEncoderCount: int
    sharedJpegCount: int
    sharedOfaCount: int
    gpuInstanceSliceCount: int
    computeInstanceSliceCount: int
    memorySizeMB: int

class c_nvmlGpuInstanceProfileInfo_t(Structure):
    id: int
    isP2pSupported: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    copyEngineCount: int
    decoderCount: int
    encoderCount: int
    jpegCount: int
    ofaCount: int
    memorySizeMB: int

class c_nvmlGpuInstanceProfileInfo_v2_t(_PrintableStructure):
    version: int
    id: int
    isP2pSupported: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    copyEngineCount: int
    decoderCount: int
    encoderCount: int
    jpegCount: int
    ofaCount: int
    memorySizeMB: int
    name: _Chars

class c_nvmlGpuInstancePlacement_t(Structure):
    start: int
    size: int

class c_nvmlGpuInstanceInfo_t(Structure):
    device: c_nvmlDevice_t
    id: int
    profileId: int
    placement: c_nvmlGpuInstancePlacement_t

class c_nvmlComputeInstancePlacement_t(Structure):
    start: int
    size: int

class c_nvmlComputeInstanceInfo_t(Structure):
    device: c_nvmlDevice_t
    gpuInstance: c_nvmlGpuInstance_t
    id: int
    profileId: int
    placement: c_nvmlComputeInstancePlacement_t

class c_nvmlComputeInstanceProfileInfo_t(Structure):
    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    sharedCopyEngineCount: int
    sharedDecoderCount: int
    sharedEncoderCount: int
    sharedJpegCount: int
    sharedOfaCount: int

class c_nvmlComputeInstanceProfileInfo_v2_t(_PrintableStructure):
    version: int
    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    sharedCopyEngineCount: int
    sharedDecoderCount: int
    sharedEncoderCount: int
    sharedJpegCount: int
    sharedOfaCount: int
    name: _Chars

class c_nvmlEventData_t(_PrintableStructure):
    device: c_nvmlDevice_t
    eventType: int
    eventData: int
    gpuInstanceId: int
    computeInstanceId: int

class c_nvmlUtilization_t(_PrintableStructure):
    gpu: int
    memory: int

class c_nvmlProcessInfo_v3_t(_PrintableStructure):
    pid: int
    usedGpuMemory: int
    gpuInstanceId: int
    computeInstanceId: int

class c_nvmlProcessUtilizationSample_t(_PrintableStructure):
    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int
    encUtil: int
    decUtil: int

class nvmlFriendlyObject:  # what nvmlStructToFriendlyObject returns: the struct's fields as attributes
    def __getattr__(self, name: str) -> int | str | None: ...

class c_nvmlGpuFabricInfo_t(_PrintableStructure):
    clusterUuid: Array[c_ubyte]
    status: int
    cliqueId: int
    state: int

class c_nvmlGpuFabricInfoV_t(_PrintableStructure):
    version: int
    clusterUuid: Array[c_ubyte]
    status: int
    cliqueId: int
    state: int
    healthMask: int

# -- functions --------------------------------------------------------------------------------------

def nvmlInit() -> None: ...
def nvmlInitWithFlags(flags: int) -> None: ...
def nvmlShutdown() -> None: ...
def nvmlSystemGetDriverVersion() -> str: ...
def nvmlSystemGetNVMLVersion() -> str: ...
def nvmlSystemGetCudaDriverVersion() -> int: ...
def nvmlSystemGetCudaDriverVersion_v2() -> int: ...
def nvmlDeviceGetCount() -> int: ...
def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t: ...
def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> c_nvmlDevice_t: ...
def nvmlDeviceGetHandleByPciBusId(pciBusId: str | bytes) -> c_nvmlDevice_t: ...
def nvmlDeviceGetIndex(handle: c_nvmlDevice_t) -> int: ...
def nvmlDeviceGetUUID(handle: c_nvmlDevice_t) -> str: ...
def nvmlDeviceGetName(handle: c_nvmlDevice_t) -> str: ...
def nvmlDeviceGetMemoryInfo(
    handle: c_nvmlDevice_t, version: int | None = None
) -> c_nvmlMemory_t | c_nvmlMemory_v2_t: ...
def nvmlDeviceGetMinorNumber(handle: c_nvmlDevice_t) -> int: ...
def nvmlDeviceGetArchitecture(device: c_nvmlDevice_t) -> int: ...
def nvmlDeviceGetBrand(handle: c_nvmlDevice_t) -> int: ...
def nvmlDeviceGetCudaComputeCapability(handle: c_nvmlDevice_t) -> tuple[int, int]: ...
def nvmlDeviceGetPciInfo(handle: c_nvmlDevice_t) -> nvmlPciInfo_t: ...
def nvmlDeviceGetPciInfo_v3(handle: c_nvmlDevice_t) -> nvmlPciInfo_t: ...
def nvmlDeviceGetMigMode(device: c_nvmlDevice_t) -> list[int]: ...  # [current, pending]
def nvmlDeviceGetMaxMigDeviceCount(device: c_nvmlDevice_t) -> int: ...
def nvmlDeviceGetMigDeviceHandleByIndex(device: c_nvmlDevice_t, index: int) -> c_nvmlDevice_t: ...
def nvmlDeviceIsMigDeviceHandle(device: c_nvmlDevice_t) -> c_uint: ...  # the ctypes value itself
def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice: c_nvmlDevice_t) -> c_nvmlDevice_t: ...
def nvmlDeviceGetGpuInstanceId(device: c_nvmlDevice_t) -> int: ...
def nvmlDeviceGetComputeInstanceId(device: c_nvmlDevice_t) -> int: ...
def nvmlDeviceGetAttributes(device: c_nvmlDevice_t) -> c_nvmlDeviceAttributes: ...
def nvmlDeviceGetAttributes_v2(device: c_nvmlDevice_t) -> c_nvmlDeviceAttributes: ...
def nvmlDeviceGetGpuInstanceProfileInfo(
    device: c_nvmlDevice_t, profile: int, version: int = 2
) -> c_nvmlGpuInstanceProfileInfo_t | c_nvmlGpuInstanceProfileInfo_v2_t: ...
def nvmlDeviceGetGpuInstanceById(device: c_nvmlDevice_t, gpuInstanceId: int) -> c_nvmlGpuInstance_t: ...
def nvmlGpuInstanceGetInfo(gpuInstance: c_nvmlGpuInstance_t) -> c_nvmlGpuInstanceInfo_t: ...

# NVML's two calls: placementsRef None (count only), then an array of countRef's value; countRef by reference.
def nvmlDeviceGetGpuInstancePossiblePlacements(
    device: c_nvmlDevice_t,
    profileId: int,
    placementsRef: Array[c_nvmlGpuInstancePlacement_t] | None,
    countRef: _CArgObject | _Pointer[c_uint],
) -> int: ...
def nvmlDeviceGetGpuInstanceRemainingCapacity(device: c_nvmlDevice_t, profileId: int) -> int: ...
def nvmlDeviceCreateGpuInstance(device: c_nvmlDevice_t, profileId: int) -> c_nvmlGpuInstance_t: ...
def nvmlDeviceCreateGpuInstanceWithPlacement(
    device: c_nvmlDevice_t, profileId: int, placement: c_nvmlGpuInstancePlacement_t
) -> c_nvmlGpuInstance_t: ...
def nvmlGpuInstanceDestroy(gpuInstance: c_nvmlGpuInstance_t) -> int: ...
def nvmlGpuInstanceGetComputeInstanceProfileInfo(
    device: c_nvmlGpuInstance_t, profile: int, engProfile: int, version: int = 2
) -> c_nvmlComputeInstanceProfileInfo_t | c_nvmlComputeInstanceProfileInfo_v2_t: ...
def nvmlGpuInstanceCreateComputeInstance(
    gpuInstance: c_nvmlGpuInstance_t, profileId: int
) -> c_nvmlComputeInstance_t: ...
def nvmlGpuInstanceGetComputeInstanceById(
    gpuInstance: c_nvmlGpuInstance_t, computeInstanceId: int
) -> c_nvmlComputeInstance_t: ...
def nvmlComputeInstanceGetInfo(computeInstance: c_nvmlComputeInstance_t) -> c_nvmlComputeInstanceInfo_t: ...
def nvmlComputeInstanceDestroy(computeInstance: c_nvmlComputeInstance_t) -> int: ...
def nvmlDeviceGetTopologyCommonAncestor(device1: c_nvmlDevice_t, device2: c_nvmlDevice_t) -> int: ...
def nvmlDeviceGetNvLinkState(device: c_nvmlDevice_t, link: int) -> int: ...
def nvmlDeviceGetNvLinkRemotePciInfo(device: c_nvmlDevice_t, link: int) -> nvmlPciInfo_t: ...
def nvmlDeviceGetNvLinkRemoteDeviceType(handle: c_nvmlDevice_t, link: int) -> int: ...
def nvmlDeviceGetRetiredPagesPendingStatus(device: c_nvmlDevice_t) -> int: ...
def nvmlDeviceGetRemappedRows(device: c_nvmlDevice_t) -> tuple[int, int, int, int]: ...
def nvmlDeviceGetTotalEccErrors(handle: c_nvmlDevice_t, errorType: int, counterType: int) -> int: ...

# The struct to fill in, by reference: ctypes.byref(info) or a pointer to it.
def nvmlDeviceGetGpuFabricInfo(
    device: c_nvmlDevice_t, gpuFabricInfo: _CArgObject | _Pointer[c_nvmlGpuFabricInfo_t]
) -> int: ...
def nvmlDeviceGetGpuFabricInfoV(
    device: c_nvmlDevice_t, gpuFabricInfo: _CArgObject | _Pointer[c_nvmlGpuFabricInfoV_t]
) -> int: ...
def nvmlDeviceGetUtilizationRates(handle: c_nvmlDevice_t) -> c_nvmlUtilization_t: ...
def nvmlDeviceGetPowerUsage(handle: c_nvmlDevice_t) -> int: ...  # milliwatts
def nvmlDeviceGetTemperature(handle: c_nvmlDevice_t, sensor: int) -> int: ...
def nvmlDeviceGetClockInfo(handle: c_nvmlDevice_t, type: int) -> int: ...  # MHz
def nvmlDeviceGetComputeRunningProcesses(handle: c_nvmlDevice_t) -> list[nvmlFriendlyObject]: ...
def nvmlDeviceGetMPSComputeRunningProcesses(handle: c_nvmlDevice_t) -> list[nvmlFriendlyObject]: ...
def nvmlDeviceGetProcessUtilization(
    handle: c_nvmlDevice_t, timeStamp: int
) -> list[c_nvmlProcessUtilizationSample_t]: ...
def nvmlStructToFriendlyObject(struct: Structure) -> nvmlFriendlyObject: ...
def nvmlDeviceGetSupportedEventTypes(handle: c_nvmlDevice_t) -> int: ...
def nvmlEventSetCreate() -> c_nvmlEventSet_t: ...
def nvmlDeviceRegisterEvents(handle: c_nvmlDevice_t, eventTypes: int, eventSet: c_nvmlEventSet_t) -> None: ...
def nvmlEventSetWait(eventSet: c_nvmlEventSet_t, timeoutms: int) -> c_nvmlEventData_t: ...
def nvmlEventSetWait_v2(eventSet: c_nvmlEventSet_t, timeoutms: int) -> c_nvmlEventData_t: ...
def nvmlEventSetFree(eventSet: c_nvmlEventSet_t) -> None: ...
