//! The knowledge base against NVIDIA's headers: every error code of the families
//! `tessera doctor` covers, written out here independently of the entries, must
//! be found by name and by `NAMESPACE:NUMBER` with its value, a cause, a fix and
//! a check; and no entry may claim a name or value the headers do not have.
//!
//! Sources: `cuda.h` (`CUresult`, CUDA 12.8) and `driver_types.h` (`cudaError`,
//! the runtime's names for the same numbers, and its runtime-only codes 9, 35,
//! 36 and 98, the only runtime-only ones covered); `cublas_api.h`
//! (`cublasStatus_t`); `cudnn_ops_infer.h` of cuDNN 8 and `cudnn_graph.h` of
//! cuDNN 9 (`cudnnStatus_t`, renumbered; cuDNN 9 keeps the old names of moved
//! codes as aliases); `nccl.h` (`ncclResult_t`); `nvml.h` (`nvmlReturn_t`).
//! Left out as not certain enough: CUDA 13's 917/918, cuDNN's 3014
//! (`NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE`).

use std::collections::BTreeSet;

use crate::cmd::doctor::kb::{Answer, Domain, Domain::*, lookup};

#[rustfmt::skip]
const HEADERS: &[(Domain, &str, i64)] = &[
    // ---- CUresult (cuda.h) ----------------------------------------------------------
    (Cuda, "CUDA_ERROR_INVALID_VALUE", 1),
    (Cuda, "CUDA_ERROR_OUT_OF_MEMORY", 2),
    (Cuda, "CUDA_ERROR_NOT_INITIALIZED", 3),
    (Cuda, "CUDA_ERROR_DEINITIALIZED", 4),
    (Cuda, "CUDA_ERROR_PROFILER_DISABLED", 5),
    (Cuda, "CUDA_ERROR_PROFILER_NOT_INITIALIZED", 6),
    (Cuda, "CUDA_ERROR_PROFILER_ALREADY_STARTED", 7),
    (Cuda, "CUDA_ERROR_PROFILER_ALREADY_STOPPED", 8),
    (Cuda, "CUDA_ERROR_STUB_LIBRARY", 34),
    (Cuda, "CUDA_ERROR_DEVICE_UNAVAILABLE", 46),
    (Cuda, "CUDA_ERROR_NO_DEVICE", 100),
    (Cuda, "CUDA_ERROR_INVALID_DEVICE", 101),
    (Cuda, "CUDA_ERROR_DEVICE_NOT_LICENSED", 102),
    (Cuda, "CUDA_ERROR_INVALID_IMAGE", 200),
    (Cuda, "CUDA_ERROR_INVALID_CONTEXT", 201),
    (Cuda, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", 202),
    (Cuda, "CUDA_ERROR_MAP_FAILED", 205),
    (Cuda, "CUDA_ERROR_UNMAP_FAILED", 206),
    (Cuda, "CUDA_ERROR_ARRAY_IS_MAPPED", 207),
    (Cuda, "CUDA_ERROR_ALREADY_MAPPED", 208),
    (Cuda, "CUDA_ERROR_NO_BINARY_FOR_GPU", 209),
    (Cuda, "CUDA_ERROR_ALREADY_ACQUIRED", 210),
    (Cuda, "CUDA_ERROR_NOT_MAPPED", 211),
    (Cuda, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", 212),
    (Cuda, "CUDA_ERROR_NOT_MAPPED_AS_POINTER", 213),
    (Cuda, "CUDA_ERROR_ECC_UNCORRECTABLE", 214),
    (Cuda, "CUDA_ERROR_UNSUPPORTED_LIMIT", 215),
    (Cuda, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", 216),
    (Cuda, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", 217),
    (Cuda, "CUDA_ERROR_INVALID_PTX", 218),
    (Cuda, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", 219),
    (Cuda, "CUDA_ERROR_NVLINK_UNCORRECTABLE", 220),
    (Cuda, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", 221),
    (Cuda, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 222),
    (Cuda, "CUDA_ERROR_JIT_COMPILATION_DISABLED", 223),
    (Cuda, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", 224),
    (Cuda, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", 225),
    (Cuda, "CUDA_ERROR_CONTAINED", 226),
    (Cuda, "CUDA_ERROR_INVALID_SOURCE", 300),
    (Cuda, "CUDA_ERROR_FILE_NOT_FOUND", 301),
    (Cuda, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", 302),
    (Cuda, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", 303),
    (Cuda, "CUDA_ERROR_OPERATING_SYSTEM", 304),
    (Cuda, "CUDA_ERROR_INVALID_HANDLE", 400),
    (Cuda, "CUDA_ERROR_ILLEGAL_STATE", 401),
    (Cuda, "CUDA_ERROR_LOSSY_QUERY", 402),
    (Cuda, "CUDA_ERROR_NOT_FOUND", 500),
    (Cuda, "CUDA_ERROR_NOT_READY", 600),
    (Cuda, "CUDA_ERROR_ILLEGAL_ADDRESS", 700),
    (Cuda, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 701),
    (Cuda, "CUDA_ERROR_LAUNCH_TIMEOUT", 702),
    (Cuda, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", 703),
    (Cuda, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", 704),
    (Cuda, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", 705),
    (Cuda, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", 708),
    (Cuda, "CUDA_ERROR_CONTEXT_IS_DESTROYED", 709),
    (Cuda, "CUDA_ERROR_ASSERT", 710),
    (Cuda, "CUDA_ERROR_TOO_MANY_PEERS", 711),
    (Cuda, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", 712),
    (Cuda, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", 713),
    (Cuda, "CUDA_ERROR_HARDWARE_STACK_ERROR", 714),
    (Cuda, "CUDA_ERROR_ILLEGAL_INSTRUCTION", 715),
    (Cuda, "CUDA_ERROR_MISALIGNED_ADDRESS", 716),
    (Cuda, "CUDA_ERROR_INVALID_ADDRESS_SPACE", 717),
    (Cuda, "CUDA_ERROR_INVALID_PC", 718),
    (Cuda, "CUDA_ERROR_LAUNCH_FAILED", 719),
    (Cuda, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", 720),
    (Cuda, "CUDA_ERROR_TENSOR_MEMORY_LEAK", 721),
    (Cuda, "CUDA_ERROR_NOT_PERMITTED", 800),
    (Cuda, "CUDA_ERROR_NOT_SUPPORTED", 801),
    (Cuda, "CUDA_ERROR_SYSTEM_NOT_READY", 802),
    (Cuda, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", 803),
    (Cuda, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", 804),
    (Cuda, "CUDA_ERROR_MPS_CONNECTION_FAILED", 805),
    (Cuda, "CUDA_ERROR_MPS_RPC_FAILURE", 806),
    (Cuda, "CUDA_ERROR_MPS_SERVER_NOT_READY", 807),
    (Cuda, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", 808),
    (Cuda, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", 809),
    (Cuda, "CUDA_ERROR_MPS_CLIENT_TERMINATED", 810),
    (Cuda, "CUDA_ERROR_CDP_NOT_SUPPORTED", 811),
    (Cuda, "CUDA_ERROR_CDP_VERSION_MISMATCH", 812),
    (Cuda, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 900),
    (Cuda, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", 901),
    (Cuda, "CUDA_ERROR_STREAM_CAPTURE_MERGE", 902),
    (Cuda, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", 903),
    (Cuda, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 904),
    (Cuda, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", 905),
    (Cuda, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", 906),
    (Cuda, "CUDA_ERROR_CAPTURED_EVENT", 907),
    (Cuda, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", 908),
    (Cuda, "CUDA_ERROR_TIMEOUT", 909),
    (Cuda, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", 910),
    (Cuda, "CUDA_ERROR_EXTERNAL_DEVICE", 911),
    (Cuda, "CUDA_ERROR_INVALID_CLUSTER_SIZE", 912),
    (Cuda, "CUDA_ERROR_FUNCTION_NOT_LOADED", 913),
    (Cuda, "CUDA_ERROR_INVALID_RESOURCE_TYPE", 914),
    (Cuda, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION", 915),
    (Cuda, "CUDA_ERROR_KEY_ROTATION", 916),
    (Cuda, "CUDA_ERROR_UNKNOWN", 999),
    // ---- cudaError (driver_types.h): the runtime's names --------------------------------
    (Cuda, "cudaErrorInvalidValue", 1),
    (Cuda, "cudaErrorMemoryAllocation", 2),
    (Cuda, "cudaErrorInitializationError", 3),
    (Cuda, "cudaErrorCudartUnloading", 4),
    (Cuda, "cudaErrorProfilerDisabled", 5),
    (Cuda, "cudaErrorProfilerNotInitialized", 6),
    (Cuda, "cudaErrorProfilerAlreadyStarted", 7),
    (Cuda, "cudaErrorProfilerAlreadyStopped", 8),
    (Cuda, "cudaErrorInvalidConfiguration", 9),
    (Cuda, "cudaErrorStubLibrary", 34),
    (Cuda, "cudaErrorInsufficientDriver", 35),
    (Cuda, "cudaErrorCallRequiresNewerDriver", 36),
    (Cuda, "cudaErrorDevicesUnavailable", 46),
    (Cuda, "cudaErrorInvalidDeviceFunction", 98),
    (Cuda, "cudaErrorNoDevice", 100),
    (Cuda, "cudaErrorInvalidDevice", 101),
    (Cuda, "cudaErrorDeviceNotLicensed", 102),
    (Cuda, "cudaErrorInvalidKernelImage", 200),
    (Cuda, "cudaErrorDeviceUninitialized", 201),
    (Cuda, "cudaErrorMapBufferObjectFailed", 205),
    (Cuda, "cudaErrorUnmapBufferObjectFailed", 206),
    (Cuda, "cudaErrorArrayIsMapped", 207),
    (Cuda, "cudaErrorAlreadyMapped", 208),
    (Cuda, "cudaErrorNoKernelImageForDevice", 209),
    (Cuda, "cudaErrorAlreadyAcquired", 210),
    (Cuda, "cudaErrorNotMapped", 211),
    (Cuda, "cudaErrorNotMappedAsArray", 212),
    (Cuda, "cudaErrorNotMappedAsPointer", 213),
    (Cuda, "cudaErrorECCUncorrectable", 214),
    (Cuda, "cudaErrorUnsupportedLimit", 215),
    (Cuda, "cudaErrorDeviceAlreadyInUse", 216),
    (Cuda, "cudaErrorPeerAccessUnsupported", 217),
    (Cuda, "cudaErrorInvalidPtx", 218),
    (Cuda, "cudaErrorInvalidGraphicsContext", 219),
    (Cuda, "cudaErrorNvlinkUncorrectable", 220),
    (Cuda, "cudaErrorJitCompilerNotFound", 221),
    (Cuda, "cudaErrorUnsupportedPtxVersion", 222),
    (Cuda, "cudaErrorJitCompilationDisabled", 223),
    (Cuda, "cudaErrorUnsupportedExecAffinity", 224),
    (Cuda, "cudaErrorUnsupportedDevSideSync", 225),
    (Cuda, "cudaErrorContained", 226),
    (Cuda, "cudaErrorInvalidSource", 300),
    (Cuda, "cudaErrorFileNotFound", 301),
    (Cuda, "cudaErrorSharedObjectSymbolNotFound", 302),
    (Cuda, "cudaErrorSharedObjectInitFailed", 303),
    (Cuda, "cudaErrorOperatingSystem", 304),
    (Cuda, "cudaErrorInvalidResourceHandle", 400),
    (Cuda, "cudaErrorIllegalState", 401),
    (Cuda, "cudaErrorLossyQuery", 402),
    (Cuda, "cudaErrorSymbolNotFound", 500),
    (Cuda, "cudaErrorNotReady", 600),
    (Cuda, "cudaErrorIllegalAddress", 700),
    (Cuda, "cudaErrorLaunchOutOfResources", 701),
    (Cuda, "cudaErrorLaunchTimeout", 702),
    (Cuda, "cudaErrorLaunchIncompatibleTexturing", 703),
    (Cuda, "cudaErrorPeerAccessAlreadyEnabled", 704),
    (Cuda, "cudaErrorPeerAccessNotEnabled", 705),
    (Cuda, "cudaErrorSetOnActiveProcess", 708),
    (Cuda, "cudaErrorContextIsDestroyed", 709),
    (Cuda, "cudaErrorAssert", 710),
    (Cuda, "cudaErrorTooManyPeers", 711),
    (Cuda, "cudaErrorHostMemoryAlreadyRegistered", 712),
    (Cuda, "cudaErrorHostMemoryNotRegistered", 713),
    (Cuda, "cudaErrorHardwareStackError", 714),
    (Cuda, "cudaErrorIllegalInstruction", 715),
    (Cuda, "cudaErrorMisalignedAddress", 716),
    (Cuda, "cudaErrorInvalidAddressSpace", 717),
    (Cuda, "cudaErrorInvalidPc", 718),
    (Cuda, "cudaErrorLaunchFailure", 719),
    (Cuda, "cudaErrorCooperativeLaunchTooLarge", 720),
    (Cuda, "cudaErrorTensorMemoryLeak", 721),
    (Cuda, "cudaErrorNotPermitted", 800),
    (Cuda, "cudaErrorNotSupported", 801),
    (Cuda, "cudaErrorSystemNotReady", 802),
    (Cuda, "cudaErrorSystemDriverMismatch", 803),
    (Cuda, "cudaErrorCompatNotSupportedOnDevice", 804),
    (Cuda, "cudaErrorMpsConnectionFailed", 805),
    (Cuda, "cudaErrorMpsRpcFailure", 806),
    (Cuda, "cudaErrorMpsServerNotReady", 807),
    (Cuda, "cudaErrorMpsMaxClientsReached", 808),
    (Cuda, "cudaErrorMpsMaxConnectionsReached", 809),
    (Cuda, "cudaErrorMpsClientTerminated", 810),
    (Cuda, "cudaErrorCdpNotSupported", 811),
    (Cuda, "cudaErrorCdpVersionMismatch", 812),
    (Cuda, "cudaErrorStreamCaptureUnsupported", 900),
    (Cuda, "cudaErrorStreamCaptureInvalidated", 901),
    (Cuda, "cudaErrorStreamCaptureMerge", 902),
    (Cuda, "cudaErrorStreamCaptureUnmatched", 903),
    (Cuda, "cudaErrorStreamCaptureUnjoined", 904),
    (Cuda, "cudaErrorStreamCaptureIsolation", 905),
    (Cuda, "cudaErrorStreamCaptureImplicit", 906),
    (Cuda, "cudaErrorCapturedEvent", 907),
    (Cuda, "cudaErrorStreamCaptureWrongThread", 908),
    (Cuda, "cudaErrorTimeout", 909),
    (Cuda, "cudaErrorGraphExecUpdateFailure", 910),
    (Cuda, "cudaErrorExternalDevice", 911),
    (Cuda, "cudaErrorInvalidClusterSize", 912),
    (Cuda, "cudaErrorFunctionNotLoaded", 913),
    (Cuda, "cudaErrorInvalidResourceType", 914),
    (Cuda, "cudaErrorInvalidResourceConfiguration", 915),
    (Cuda, "cudaErrorUnknown", 999),
    // ---- cublasStatus_t (cublas_api.h) --------------------------------------------------
    (Cublas, "CUBLAS_STATUS_NOT_INITIALIZED", 1),
    (Cublas, "CUBLAS_STATUS_ALLOC_FAILED", 3),
    (Cublas, "CUBLAS_STATUS_INVALID_VALUE", 7),
    (Cublas, "CUBLAS_STATUS_ARCH_MISMATCH", 8),
    (Cublas, "CUBLAS_STATUS_MAPPING_ERROR", 11),
    (Cublas, "CUBLAS_STATUS_EXECUTION_FAILED", 13),
    (Cublas, "CUBLAS_STATUS_INTERNAL_ERROR", 14),
    (Cublas, "CUBLAS_STATUS_NOT_SUPPORTED", 15),
    (Cublas, "CUBLAS_STATUS_LICENSE_ERROR", 16),
    // ---- cudnnStatus_t, cuDNN 8 (cudnn_ops_infer.h) -------------------------------------
    (Cudnn, "CUDNN_STATUS_NOT_INITIALIZED", 1),
    (Cudnn, "CUDNN_STATUS_ALLOC_FAILED", 2),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM", 3),
    (Cudnn, "CUDNN_STATUS_INTERNAL_ERROR", 4),
    (Cudnn, "CUDNN_STATUS_INVALID_VALUE", 5),
    (Cudnn, "CUDNN_STATUS_ARCH_MISMATCH", 6),
    (Cudnn, "CUDNN_STATUS_MAPPING_ERROR", 7),
    (Cudnn, "CUDNN_STATUS_EXECUTION_FAILED", 8),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED", 9),
    (Cudnn, "CUDNN_STATUS_LICENSE_ERROR", 10),
    (Cudnn, "CUDNN_STATUS_RUNTIME_PREREQUISITE_MISSING", 11),
    (Cudnn, "CUDNN_STATUS_RUNTIME_IN_PROGRESS", 12),
    (Cudnn, "CUDNN_STATUS_RUNTIME_FP_OVERFLOW", 13),
    (Cudnn, "CUDNN_STATUS_VERSION_MISMATCH", 14),
    // ---- cudnnStatus_t, cuDNN 9 (cudnn_graph.h) -----------------------------------------
    (Cudnn, "CUDNN_STATUS_NOT_INITIALIZED", 1001),
    (Cudnn, "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH", 1002),
    (Cudnn, "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH", 1003),
    (Cudnn, "CUDNN_STATUS_DEPRECATED", 1004),
    (Cudnn, "CUDNN_STATUS_LICENSE_ERROR", 1005),
    (Cudnn, "CUDNN_STATUS_RUNTIME_IN_PROGRESS", 1006),
    (Cudnn, "CUDNN_STATUS_RUNTIME_FP_OVERFLOW", 1007),
    (Cudnn, "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED", 1008),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM", 2000),
    (Cudnn, "CUDNN_STATUS_INVALID_VALUE", 2001),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM_NULL_POINTER", 2002),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER", 2003),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED", 2004),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND", 2005),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT", 2006),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH", 2007),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH", 2008),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES", 2009),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE", 2010),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH", 2011),
    (Cudnn, "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE", 2012),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED", 3000),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN", 3001),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_SHAPE", 3002),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE", 3003),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT", 3004),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER", 3005),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART", 3006),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH", 3007),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING", 3008),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE", 3009),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT", 3010),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_PADDING", 3011),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM", 3012),
    (Cudnn, "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API", 3013),
    (Cudnn, "CUDNN_STATUS_INTERNAL_ERROR", 4000),
    (Cudnn, "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED", 4001),
    (Cudnn, "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE", 4002),
    (Cudnn, "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED", 4003),
    (Cudnn, "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", 4004),
    (Cudnn, "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM", 4005),
    (Cudnn, "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED", 4006),
    (Cudnn, "CUDNN_STATUS_EXECUTION_FAILED", 5000),
    (Cudnn, "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER", 5001),
    (Cudnn, "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS", 5002),
    (Cudnn, "CUDNN_STATUS_EXECUTION_FAILED_CUDART", 5003),
    (Cudnn, "CUDNN_STATUS_EXECUTION_FAILED_CURAND", 5004),
    // cuDNN 9's aliases: the old names of codes that moved into a category.
    (Cudnn, "CUDNN_STATUS_ALLOC_FAILED", 4003),
    (Cudnn, "CUDNN_STATUS_ARCH_MISMATCH", 3007),
    (Cudnn, "CUDNN_STATUS_MAPPING_ERROR", 4006),
    (Cudnn, "CUDNN_STATUS_RUNTIME_PREREQUISITE_MISSING", 3008),
    (Cudnn, "CUDNN_STATUS_VERSION_MISMATCH", 1002),
    // ---- ncclResult_t (nccl.h) ----------------------------------------------------------
    (Nccl, "ncclUnhandledCudaError", 1),
    (Nccl, "ncclSystemError", 2),
    (Nccl, "ncclInternalError", 3),
    (Nccl, "ncclInvalidArgument", 4),
    (Nccl, "ncclInvalidUsage", 5),
    (Nccl, "ncclRemoteError", 6),
    (Nccl, "ncclInProgress", 7),
    (Nccl, "ncclTimeout", 8),
    // ---- nvmlReturn_t (nvml.h) ----------------------------------------------------------
    (Nvml, "NVML_ERROR_UNINITIALIZED", 1),
    (Nvml, "NVML_ERROR_INVALID_ARGUMENT", 2),
    (Nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
    (Nvml, "NVML_ERROR_NO_PERMISSION", 4),
    (Nvml, "NVML_ERROR_ALREADY_INITIALIZED", 5),
    (Nvml, "NVML_ERROR_NOT_FOUND", 6),
    (Nvml, "NVML_ERROR_INSUFFICIENT_SIZE", 7),
    (Nvml, "NVML_ERROR_INSUFFICIENT_POWER", 8),
    (Nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9),
    (Nvml, "NVML_ERROR_TIMEOUT", 10),
    (Nvml, "NVML_ERROR_IRQ_ISSUE", 11),
    (Nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12),
    (Nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
    (Nvml, "NVML_ERROR_CORRUPTED_INFOROM", 14),
    (Nvml, "NVML_ERROR_GPU_IS_LOST", 15),
    (Nvml, "NVML_ERROR_RESET_REQUIRED", 16),
    (Nvml, "NVML_ERROR_OPERATING_SYSTEM", 17),
    (Nvml, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18),
    (Nvml, "NVML_ERROR_IN_USE", 19),
    (Nvml, "NVML_ERROR_MEMORY", 20),
    (Nvml, "NVML_ERROR_NO_DATA", 21),
    (Nvml, "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED", 22),
    (Nvml, "NVML_ERROR_INSUFFICIENT_RESOURCES", 23),
    (Nvml, "NVML_ERROR_FREQ_NOT_SUPPORTED", 24),
    (Nvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25),
    (Nvml, "NVML_ERROR_DEPRECATED", 26),
    (Nvml, "NVML_ERROR_NOT_READY", 27),
    (Nvml, "NVML_ERROR_GPU_NOT_FOUND", 28),
    (Nvml, "NVML_ERROR_INVALID_STATE", 29),
    (Nvml, "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED", 30),
    (Nvml, "NVML_ERROR_UNKNOWN", 999),
];

/// The numbers of an answer's `code` (`"2"`, `"cuDNN 8: 2, cuDNN 9: 4003"`).
fn values(a: &Answer) -> Vec<i64> {
    a.code
        .split(", ")
        .filter_map(|part| part.rsplit(' ').next()?.parse().ok())
        .collect()
}

/// `a` is the entry for `name` = `value` of `domain`, and says something.
fn answers(a: &Answer, domain: Domain, name: &str, value: i64) -> bool {
    a.domain == domain
        && (a.name == name || a.aliases.iter().any(|n| n == name))
        && values(a).contains(&value)
        && !a.cause.trim().is_empty()
        && !a.fix.trim().is_empty()
        && !a.tessera_checks.trim().is_empty()
}

#[test]
fn every_header_code_is_found_by_name_and_by_number() {
    let mut missing = Vec::new();
    for &(domain, name, value) in HEADERS {
        if !lookup(name)
            .unwrap()
            .iter()
            .any(|a| answers(a, domain, name, value))
        {
            missing.push(format!("{name} ({value}) by name"));
        }
        let numbered = format!("{}:{value}", domain.name());
        if !lookup(&numbered)
            .unwrap()
            .iter()
            .any(|a| answers(a, domain, name, value))
        {
            missing.push(format!("{numbered} as {name}"));
        }
    }
    assert!(
        missing.is_empty(),
        "{} header codes have no complete entry: {missing:#?}",
        missing.len()
    );
}

/// The other way round: an entry's every name and value is one of the headers'
/// (a typo in a name, or a value invented or moved, shows here).
#[test]
fn entries_claim_only_header_names_and_values() {
    let known: BTreeSet<(Domain, &str, i64)> = HEADERS.iter().copied().collect();
    for c in super::codes() {
        let vals: Vec<i64> = c.values.iter().map(|(_, v)| *v).collect();
        for v in &vals {
            assert!(
                HEADERS.iter().any(|(d, _, hv)| *d == c.domain && hv == v),
                "{} claims {} {v}, which no header has",
                c.name,
                c.domain.name()
            );
        }
        for n in std::iter::once(c.name).chain(c.aliases.iter().copied()) {
            assert!(
                vals.iter().any(|v| known.contains(&(c.domain, n, *v))),
                "{}: the headers have no {n} with one of its values {vals:?}",
                c.name
            );
        }
    }
}
