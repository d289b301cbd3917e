#!/bin/sh
# generate.sh rebuilds the fixture host trees in this directory. Each tree
# has sys/, dev/ and proc/ mirroring one kind of real machine, with the
# symlinks real sysfs has (/sys/bus/*/devices/* -> ../../../devices/...,
# driver and iommu_group links). Device nodes are empty regular files: a
# fixture cannot hold real char devices without root, and discovery treats
# a regular file as a present node.
#
#   dgx-h100   2-socket, 8-GPU DGX-H100-like host: GPUs 0-3 on NUMA node 0,
#              4-7 on node 1; NVIDIA driver procfs; 8 ConnectX-7 NICs, two
#              of them bound to vfio-pci (IOMMU groups 40 and 41).
#   mi250      2-socket host with 4 MI250 GCDs (KFD nodes 2-5 after CPU
#              nodes 0-1), two per NUMA node, and an ASPEED BMC VGA as card0;
#              each GCD at KFD node n is n*10 % busy, uses n GiB of 64 GiB
#              VRAM, draws 100+n W and is at 40+n degrees C.
#   mi300x     2-socket host with 8 MI300X, four per NUMA node, each in
#              the CPX compute partition mode (NPS4 memory): 8 partitions
#              of one XCC per GPU, 64 KFD GPU nodes (2-65) that share
#              their GPU's PCI address, each with its own render node
#              (the GPU's own renderD128+g for partition 0, the partition
#              devices' renderD136.. for the others).
#   laptop     a laptop (no NUMA: numa_node -1) with an FTDI and a CH340
#              USB serial adapter, an Arduino (cdc-acm), an Intel iGPU,
#              /dev/fuse, /dev/kvm and /dev/net/tun.
#
# Usage: ./generate.sh   (from this directory; rewrites the three trees)
set -eu
cd "$(dirname "$0")"

f() { mkdir -p "$(dirname "$1")"; printf '%s\n' "$2" >"$1"; }
node() { mkdir -p "$(dirname "$1")"; : >"$1"; }
link() { mkdir -p "$(dirname "$2")"; ln -sfn "$1" "$2"; }

# pcidev ROOT BRIDGE ADDR VENDOR DEVICE CLASS NUMA DRIVER [IOMMU]
pcidev() {
	r=$1 bridge=$2 addr=$3
	d=$r/sys/devices/$bridge/$addr
	f "$d/vendor" "0x$4"
	f "$d/device" "0x$5"
	f "$d/class" "0x$6"
	f "$d/subsystem_vendor" "0x$4"
	f "$d/subsystem_device" "0x0000"
	f "$d/numa_node" "$7"
	[ -n "$8" ] && mkdir -p "$r/sys/bus/pci/drivers/$8"
	[ -n "${9:-}" ] && mkdir -p "$r/sys/kernel/iommu_groups/$9/devices"
	depth=$(printf '%s' "devices/$bridge/$addr" | tr -cd / | wc -c)
	up=""
	k=0
	while [ "$k" -lt $((depth + 1)) ]; do up="../$up"; k=$((k + 1)); done
	# bus/pci/devices/ADDR -> ../../../devices/BRIDGE/ADDR
	link "../../../devices/$bridge/$addr" "$r/sys/bus/pci/devices/$addr"
	if [ -n "$8" ]; then
		link "${up}bus/pci/drivers/$8" "$d/driver"
	fi
	if [ -n "${9:-}" ]; then
		link "${up}kernel/iommu_groups/$9" "$d/iommu_group"
		link "../../../../devices/$bridge/$addr" "$r/sys/kernel/iommu_groups/$9/devices/$addr"
	fi
	return 0
}

nvgpu() { # ROOT BRIDGE ADDR MINOR UUID NUMA
	r=$1
	pcidev "$r" "$2" "$3" 10de 2330 030200 "$6" nvidia
	f "$r/proc/driver/nvidia/gpus/$3/information" "$(printf 'Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t %d\nGPU UUID: \t %s\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\nGPU Excluded:\t No' $((200 + $4)) "$5" "$3" "$4")"
	node "$r/dev/nvidia$4"
}

rm -rf dgx-h100 mi250 mi300x laptop

# --- dgx-h100 ---------------------------------------------------------------
r=dgx-h100
i=0
for spec in 18:0:pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0 \
	2a:0:pci0000:27/0000:27:01.0/0000:28:00.0/0000:29:00.0 \
	3a:0:pci0000:37/0000:37:01.0/0000:38:00.0/0000:39:00.0 \
	5d:0:pci0000:5a/0000:5a:01.0/0000:5b:00.0/0000:5c:00.0 \
	9a:1:pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:00.0 \
	ab:1:pci0000:a8/0000:a8:01.0/0000:a9:00.0/0000:aa:00.0 \
	ba:1:pci0000:b7/0000:b7:01.0/0000:b8:00.0/0000:b9:00.0 \
	db:1:pci0000:d8/0000:d8:01.0/0000:d9:00.0/0000:da:00.0; do
	bus=${spec%%:*}
	rest=${spec#*:}
	numa=${rest%%:*}
	bridge=${rest#*:}
	nvgpu $r "$bridge" "0000:$bus:00.0" $i "GPU-$(printf '%08x' $((0x5e1a0000 + i)))-7d2c-4d11-9b3e-0a1b2c3d4e5$i" "$numa"
	# One ConnectX-7 per GPU on the same switch.
	nbus=$(printf '%02x' $((0x$bus + 1)))
	drv=mlx5_core grp=""
	if [ $i -ge 6 ]; then drv=vfio-pci grp=$((34 + i)); node "$r/dev/vfio/$grp"; fi
	pcidev $r "${bridge%/*}" "0000:$nbus:00.0" 15b3 1021 020700 "$numa" "$drv" $grp
	i=$((i + 1))
done
node $r/dev/nvidiactl
node $r/dev/nvidia-uvm
node $r/dev/nvidia-uvm-tools
node $r/dev/nvidia-modeset
node $r/dev/vfio/vfio
f $r/proc/driver/nvidia/version "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.90.07  Release Build"

# --- mi250 ------------------------------------------------------------------
r=mi250
kfd=$r/sys/devices/virtual/kfd/kfd
link ../../devices/virtual/kfd/kfd $r/sys/class/kfd/kfd
for n in 0 1; do
	f $kfd/topology/nodes/$n/properties "$(printf 'cpu_cores_count 64\nsimd_count 0\nmem_banks_count 1\ncaches_count 0\nio_links_count 3\np2p_links_count 0\ncpu_core_id_base %d\nsimd_id_base 0\nmax_waves_per_simd 0\nlds_size_in_kb 0\ngds_size_in_kb 0\nnum_gws 0\nwave_front_size 0\narray_count 0\nsimd_arrays_per_engine 0\ncu_per_simd_array 0\nsimd_per_cu 0\nmax_slots_scratch_cu 0\ngfx_target_version 0\nvendor_id 0\ndevice_id 0\nlocation_id 0\ndomain 0\ndrm_render_minor 0\nhive_id 0\nnum_sdma_engines 0\nnum_sdma_xgmi_engines 0\nnum_sdma_queues_per_engine 0\nnum_cp_queues 0\nmax_engine_clk_ccompute 2450\nlocal_mem_size 0\nfw_version 0\ncapability 0\ndebug_prop 0\nsdma_fw_version 0\nunique_id 0\nnum_xcc 0\nmax_engine_clk_fcompute 0' $((n * 64)))"
	f $kfd/topology/nodes/$n/gpu_id 0
	f $kfd/topology/nodes/$n/name ""
done
pcidev $r pci0000:00/0000:00:07.1 0000:03:00.0 1a03 2000 030000 0 ast
mkdir -p $r/sys/devices/pci0000:00/0000:00:07.1/0000:03:00.0/drm/card0
node $r/dev/dri/card0
n=2
for spec in 29:0:pci0000:20/0000:20:01.1/0000:27:00.0/0000:28:00.0 \
	2c:0:pci0000:20/0000:20:01.1/0000:27:00.0/0000:28:01.0 \
	a9:1:pci0000:a0/0000:a0:01.1/0000:a7:00.0/0000:a8:00.0 \
	ac:1:pci0000:a0/0000:a0:01.1/0000:a7:00.0/0000:a8:01.0; do
	bus=${spec%%:*}
	rest=${spec#*:}
	numa=${rest%%:*}
	bridge=${rest#*:}
	addr=0000:$bus:00.0
	minor=$((126 + n))
	card=$((n - 1))
	pcidev $r "$bridge" $addr 1002 740c 038000 "$numa" amdgpu
	d=$r/sys/devices/$bridge/$addr
	mkdir -p "$d/drm/card$card" "$d/drm/renderD$minor"
	f "$d/product_name" "AMD Instinct MI250X/MI250"
	# What amdgpu reports of use (dpkit exporter): busy %, VRAM in bytes,
	# power in microwatts and temperature in millidegrees from hwmon.
	f "$d/gpu_busy_percent" $((n * 10))
	f "$d/mem_info_vram_total" 68702699520
	f "$d/mem_info_vram_used" $((n * 1073741824))
	f "$d/hwmon/hwmon$n/name" amdgpu
	f "$d/hwmon/hwmon$n/power1_average" $((100000000 + n * 1000000))
	f "$d/hwmon/hwmon$n/temp1_input" $((40000 + n * 1000))
	f $kfd/topology/nodes/$n/gpu_id $((40000 + n * 1111))
	f $kfd/topology/nodes/$n/name gfx90a
	f $kfd/topology/nodes/$n/properties "$(printf 'cpu_cores_count 0\nsimd_count 416\nmem_banks_count 1\ncaches_count 253\nio_links_count 1\np2p_links_count 7\ncpu_core_id_base 0\nsimd_id_base 2147487744\nmax_waves_per_simd 8\nlds_size_in_kb 64\ngds_size_in_kb 0\nnum_gws 64\nwave_front_size 64\narray_count 8\nsimd_arrays_per_engine 1\ncu_per_simd_array 13\nsimd_per_cu 4\nmax_slots_scratch_cu 32\ngfx_target_version 90010\nvendor_id 4098\ndevice_id 29708\nlocation_id %d\ndomain 0\ndrm_render_minor %d\nhive_id 14528469163123571201\nnum_sdma_engines 2\nnum_sdma_xgmi_engines 3\nnum_sdma_queues_per_engine 8\nnum_cp_queues 24\nmax_engine_clk_fcompute 1700\nlocal_mem_size 0\nfw_version 79\ncapability 746947200\ndebug_prop 1495\nsdma_fw_version 9\nunique_id %d\nnum_xcc 1\nmax_engine_clk_ccompute 2450' $((0x$bus << 8)) $minor $((8829184918163153000 + n)))"
	node $r/dev/dri/card$card
	node $r/dev/dri/renderD$minor
	n=$((n + 1))
done
node $r/dev/kfd

# --- mi300x -----------------------------------------------------------------
r=mi300x
kfd=$r/sys/devices/virtual/kfd/kfd
link ../../devices/virtual/kfd/kfd $r/sys/class/kfd/kfd
for n in 0 1; do
	f $kfd/topology/nodes/$n/properties "$(printf 'cpu_cores_count 96\nsimd_count 0\nmem_banks_count 1\ncaches_count 0\nio_links_count 9\np2p_links_count 0\ncpu_core_id_base %d\nsimd_id_base 0\nmax_waves_per_simd 0\nlds_size_in_kb 0\ngds_size_in_kb 0\nnum_gws 0\nwave_front_size 0\narray_count 0\nsimd_arrays_per_engine 0\ncu_per_simd_array 0\nsimd_per_cu 0\nmax_slots_scratch_cu 0\ngfx_target_version 0\nvendor_id 0\ndevice_id 0\nlocation_id 0\ndomain 0\ndrm_render_minor 0\nhive_id 0\nnum_sdma_engines 0\nnum_sdma_xgmi_engines 0\nnum_sdma_queues_per_engine 0\nnum_cp_queues 0\nmax_engine_clk_ccompute 3700\nlocal_mem_size 0\nfw_version 0\ncapability 0\ndebug_prop 0\nsdma_fw_version 0\nunique_id 0\nnum_xcc 0\nmax_engine_clk_fcompute 0' $((n * 96)))"
	f $kfd/topology/nodes/$n/gpu_id 0
	f $kfd/topology/nodes/$n/name ""
done
n=2
g=0
for spec in 05:0:pci0000:00/0000:00:01.1/0000:03:00.0/0000:04:00.0 \
	26:0:pci0000:20/0000:20:01.1/0000:24:00.0/0000:25:00.0 \
	46:0:pci0000:40/0000:40:01.1/0000:44:00.0/0000:45:00.0 \
	65:0:pci0000:60/0000:60:01.1/0000:63:00.0/0000:64:00.0 \
	85:1:pci0000:80/0000:80:01.1/0000:83:00.0/0000:84:00.0 \
	a5:1:pci0000:a0/0000:a0:01.1/0000:a3:00.0/0000:a4:00.0 \
	c5:1:pci0000:c0/0000:c0:01.1/0000:c3:00.0/0000:c4:00.0 \
	e5:1:pci0000:e0/0000:e0:01.1/0000:e3:00.0/0000:e4:00.0; do
	bus=${spec%%:*}
	rest=${spec#*:}
	numa=${rest%%:*}
	bridge=${rest#*:}
	addr=0000:$bus:00.0
	pcidev $r "$bridge" $addr 1002 74a1 120000 "$numa" amdgpu
	d=$r/sys/devices/$bridge/$addr
	mkdir -p "$d/drm/card$((g + 1))" "$d/drm/renderD$((128 + g))"
	node $r/dev/dri/card$((g + 1))
	f "$d/product_name" "AMD Instinct MI300X"
	f "$d/current_compute_partition" CPX
	f "$d/available_compute_partition" "SPX, DPX, QPX, CPX"
	f "$d/current_memory_partition" NPS4
	f "$d/available_memory_partition" "NPS1, NPS4"
	f "$d/gpu_busy_percent" 0
	f "$d/mem_info_vram_total" 206158430208
	f "$d/mem_info_vram_used" 0
	for p in 0 1 2 3 4 5 6 7; do
		if [ $p -eq 0 ]; then minor=$((128 + g)); else minor=$((136 + g * 7 + p - 1)); fi
		f $kfd/topology/nodes/$n/gpu_id $((50000 + n * 1111))
		f $kfd/topology/nodes/$n/name gfx942
		f $kfd/topology/nodes/$n/properties "$(printf 'cpu_cores_count 0\nsimd_count 152\nmem_banks_count 1\ncaches_count 102\nio_links_count 1\np2p_links_count 7\ncpu_core_id_base 0\nsimd_id_base 2147487744\nmax_waves_per_simd 8\nlds_size_in_kb 64\ngds_size_in_kb 0\nnum_gws 64\nwave_front_size 64\narray_count 4\nsimd_arrays_per_engine 1\ncu_per_simd_array 10\nsimd_per_cu 4\nmax_slots_scratch_cu 32\ngfx_target_version 90402\nvendor_id 4098\ndevice_id 29857\nlocation_id %d\ndomain 0\ndrm_render_minor %d\nhive_id 9873298012746190571\nnum_sdma_engines 2\nnum_sdma_xgmi_engines 0\nnum_sdma_queues_per_engine 8\nnum_cp_queues 8\nmax_engine_clk_fcompute 2100\nlocal_mem_size 0\nfw_version 177\ncapability 746948224\ndebug_prop 1511\nsdma_fw_version 22\nunique_id %d\nnum_xcc 1\nmax_engine_clk_ccompute 3700' $((0x$bus << 8)) $minor $((6171823300981734000 + g)))"
		node $r/dev/dri/renderD$minor
		n=$((n + 1))
	done
	g=$((g + 1))
done
node $r/dev/kfd

# --- laptop -----------------------------------------------------------------
r=laptop
pcidev $r pci0000:00 0000:00:14.0 8086 51ed 0c0330 -1 xhci_hcd
pcidev $r pci0000:00 0000:00:02.0 8086 a7a0 030000 -1 i915
mkdir -p $r/sys/devices/pci0000:00/0000:00:02.0/drm/card0 $r/sys/devices/pci0000:00/0000:00:02.0/drm/renderD128 \
	$r/sys/devices/pci0000:00/0000:00:02.0/drm/card0-eDP-1
node $r/dev/dri/card0
node $r/dev/dri/renderD128
x=pci0000:00/0000:00:14.0
# usbdev PATH NAME VENDOR PRODUCT BUSNUM DEVNUM SERIAL MANUFACTURER PRODUCT
usbdev() {
	d=$r/sys/devices/$1
	f "$d/idVendor" "$3"
	f "$d/idProduct" "$4"
	f "$d/busnum" "$5"
	f "$d/devnum" "$6"
	[ -n "$7" ] && f "$d/serial" "$7"
	f "$d/manufacturer" "$8"
	f "$d/product" "$9"
	link "../../../devices/$1" "$r/sys/bus/usb/devices/$2"
	node "$r/dev/bus/usb/$(printf '%03d' "$5")/$(printf '%03d' "$6")"
}
usbdev $x/usb1 usb1 1d6b 0002 1 1 0000:00:14.0 "Linux 6.8.0 xhci-hcd" "xHCI Host Controller"
usbdev $x/usb3 usb3 1d6b 0002 3 1 0000:00:14.0 "Linux 6.8.0 xhci-hcd" "xHCI Host Controller"
usbdev $x/usb1/1-2 1-2 0403 6001 1 4 A50285BI FTDI "FT232R USB UART"
mkdir -p $r/sys/devices/$x/usb1/1-2/1-2:1.0/ttyUSB0
link ../../../devices/$x/usb1/1-2/1-2:1.0 $r/sys/bus/usb/devices/1-2:1.0
node $r/dev/ttyUSB0
usbdev $x/usb1/1-3 1-3 1a86 7523 1 5 "" "" "USB Serial"
mkdir -p $r/sys/devices/$x/usb1/1-3/1-3:1.0/ttyUSB1
node $r/dev/ttyUSB1
usbdev $x/usb3/3-1 3-1 2341 0043 3 2 95530343834351A0B1C1 "Arduino (www.arduino.cc)" ""
mkdir -p $r/sys/devices/$x/usb3/3-1/3-1:1.0/tty/ttyACM0
node $r/dev/ttyACM0
node $r/dev/fuse
node $r/dev/kvm
node $r/dev/net/tun
# Every sysfs directory has a uevent file. Writing one into each directory
# that would otherwise be empty also keeps those directories in git, which
# stores files, not directories.
find . -mindepth 2 -type d -empty -exec touch {}/uevent \;
echo "fixtures written"
