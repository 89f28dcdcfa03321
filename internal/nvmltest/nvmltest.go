// Package nvmltest builds go-nvml mocks of NVIDIA machines for tests.
// Every device call hostenv makes is answered, so a test overrides only
// the calls it cares about (the mocks' fields are plain funcs).
package nvmltest

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// What Device answers besides memory.
const (
	UtilizationPct = 37      // GPU utilisation, percent
	PowerDrawMW    = 61_000  // power draw, milliwatts
	PowerLimitMW   = 250_000 // enforced power limit, milliwatts
)

// Device is a GPU named name with total bytes of memory, free of them free,
// at UtilizationPct, drawing PowerDrawMW of PowerLimitMW.
func Device(name string, total, free uint64) *mock.Device {
	return &mock.Device{
		GetNameFunc: func() (string, nvml.Return) { return name, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: total, Free: free, Used: total - free}, nvml.SUCCESS
		},
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: UtilizationPct, Memory: UtilizationPct / 2}, nvml.SUCCESS
		},
		GetPowerUsageFunc:           func() (uint32, nvml.Return) { return PowerDrawMW, nvml.SUCCESS },
		GetEnforcedPowerLimitFunc:   func() (uint32, nvml.Return) { return PowerLimitMW, nvml.SUCCESS },
		GetPowerManagementLimitFunc: func() (uint32, nvml.Return) { return PowerLimitMW, nvml.SUCCESS },
	}
}

// Unsupported makes dev's name, utilisation and power calls fail with
// ERROR_NOT_SUPPORTED, as on GPUs and drivers without them; its memory
// still answers. It returns dev.
func Unsupported(dev *mock.Device) *mock.Device {
	dev.GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_NOT_SUPPORTED }
	dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED }
	dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	dev.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	dev.GetPowerManagementLimitFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	return dev
}

// Library is an NVML library that starts and holds devs.
func Library(devs ...*mock.Device) *mock.Interface {
	return &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return devs[i], nvml.SUCCESS
		},
	}
}

// GPU is a library with one device of total bytes, free of them free.
func GPU(total, free uint64) *mock.Interface {
	return Library(Device("NVIDIA Mock GPU", total, free))
}

// Missing is a library that is not installed: Init fails with
// ERROR_LIBRARY_NOT_FOUND.
func Missing() *mock.Interface {
	return &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
}
