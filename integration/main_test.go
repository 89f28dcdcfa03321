package integration

import (
	"log/slog"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	// llama.cpp's loader logs through the default logger; keep it to warnings.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(m.Run())
}
