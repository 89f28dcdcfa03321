// Package nvmltest builds go-nvml mocks of NVIDIA machines for tests.
package nvmltest

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// GPU is a library with one device of total bytes, free of them free.
func GPU(total, free uint64) *mock.Interface {
	dev := &mock.Device{GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{Total: total, Free: free, Used: total - free}, nvml.SUCCESS
	}}
	return &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 1, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS },
	}
}
