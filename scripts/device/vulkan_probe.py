#!/usr/bin/env python3
"""Lists what the Vulkan driver offers CubeCL's wgpu runtime for tensor cores: each physical
device's name and API version, whether it has VK_KHR_cooperative_matrix (the extension
cubecl-wgpu reads: without it no `cmma` product is registered and the flash kernels take
their FMA variant) or NVIDIA's older VK_NV_cooperative_matrix, and the KHR extension's
products as cubecl-wgpu filters them (subgroup scope, result type = C type, no saturation).

Uses the system's libvulkan through ctypes; no Python packages. Usage:
    python3 scripts/device/vulkan_probe.py
"""

import ctypes
import sys

COMPONENT = {0: "f16", 1: "f32", 2: "f64", 3: "i8", 4: "i16", 5: "i32", 6: "i64", 7: "u8",
             8: "u16", 9: "u32", 10: "u64", 1000141000: "bf16", 1000491002: "e4m3",
             1000491003: "e5m2"}
SCOPE_SUBGROUP = 3
STYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR = 1000506001


class ApplicationInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int32), ("pNext", ctypes.c_void_p),
                ("pApplicationName", ctypes.c_char_p), ("applicationVersion", ctypes.c_uint32),
                ("pEngineName", ctypes.c_char_p), ("engineVersion", ctypes.c_uint32),
                ("apiVersion", ctypes.c_uint32)]


class InstanceCreateInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int32), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(ApplicationInfo)),
                ("enabledLayerCount", ctypes.c_uint32), ("ppEnabledLayerNames", ctypes.c_void_p),
                ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


class ExtensionProperties(ctypes.Structure):
    _fields_ = [("extensionName", ctypes.c_char * 256), ("specVersion", ctypes.c_uint32)]


class CooperativeMatrixProperties(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int32), ("pNext", ctypes.c_void_p),
                ("MSize", ctypes.c_uint32), ("NSize", ctypes.c_uint32), ("KSize", ctypes.c_uint32),
                ("AType", ctypes.c_int32), ("BType", ctypes.c_int32), ("CType", ctypes.c_int32),
                ("ResultType", ctypes.c_int32), ("saturatingAccumulation", ctypes.c_uint32),
                ("scope", ctypes.c_int32)]


def version(v):
    return f"{v >> 22 & 0x7F}.{v >> 12 & 0x3FF}.{v & 0xFFF}"


def main():
    try:
        vk = ctypes.CDLL("libvulkan.so.1")
    except OSError as e:
        print(f"no libvulkan.so.1: {e}")
        return 1
    app = ApplicationInfo(0, None, b"vulkan_probe", 1, b"none", 1, (1 << 22) | (3 << 12))
    info = InstanceCreateInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ctypes.c_void_p()
    result = vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance))
    if result != 0:
        print(f"vkCreateInstance failed: VkResult {result}")
        return 1
    count = ctypes.c_uint32()
    vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
    devices = (ctypes.c_void_p * count.value)()
    vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), devices)
    vk.vkGetInstanceProcAddr.restype = ctypes.c_void_p
    address = vk.vkGetInstanceProcAddr(instance, b"vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
    for device in devices:
        props = ctypes.create_string_buffer(4096)
        vk.vkGetPhysicalDeviceProperties(ctypes.c_void_p(device), props)
        api = int.from_bytes(props.raw[0:4], "little")
        name = props.raw[20:276].split(b"\0")[0].decode()
        n = ctypes.c_uint32()
        vk.vkEnumerateDeviceExtensionProperties(ctypes.c_void_p(device), None, ctypes.byref(n), None)
        exts = (ExtensionProperties * n.value)()
        vk.vkEnumerateDeviceExtensionProperties(ctypes.c_void_p(device), None, ctypes.byref(n), exts)
        names = {e.extensionName.decode() for e in exts}
        khr = "VK_KHR_cooperative_matrix" in names
        nv = "VK_NV_cooperative_matrix" in names
        print(f"device: {name}, Vulkan {version(api)}, {n.value} extensions; "
              f"VK_KHR_cooperative_matrix {'yes' if khr else 'no'}, "
              f"VK_NV_cooperative_matrix {'yes' if nv else 'no'}")
        if not khr or not address:
            continue
        query = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32),
                                 ctypes.c_void_p)(address)
        m = ctypes.c_uint32()
        query(device, ctypes.byref(m), None)
        products = (CooperativeMatrixProperties * m.value)()
        for p in products:
            p.sType = STYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
        query(device, ctypes.byref(m), products)
        for p in products:
            kept = (p.scope == SCOPE_SUBGROUP and p.ResultType == p.CType
                    and not p.saturatingAccumulation)
            types = "x".join(COMPONENT.get(t, str(t)) for t in (p.AType, p.BType, p.CType, p.ResultType))
            print(f"  {p.MSize}x{p.NSize}x{p.KSize} {types} scope {p.scope}"
                  f"{'' if kept else ' (not registered by cubecl-wgpu)'}")
    vk.vkDestroyInstance(instance, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
