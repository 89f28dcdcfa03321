package codex

import (
	"strings"
	"testing"
)

func TestLoadSettings(t *testing.T) {
	dir := t.TempDir()
	if _, found, err := LoadSettings(dir, nil); found || err != nil {
		t.Fatalf("no file: found %v err %v", found, err)
	}
	write(t, dir, SettingsFile, "[limits]\nmax_depth = 10\nanswer_reserve = 64\n")
	s, found, err := LoadSettings(dir, nil)
	if err != nil || !found || s.Limits.MaxDepth != 10 || s.Limits.AnswerReserve != 64 {
		t.Fatalf("settings %+v found %v err %v", s, found, err)
	}
	write(t, dir, "one.go", "package one\n")
	if s, _, err := LoadSettings(dir+"/one.go", nil); err != nil || s.Limits.MaxDepth != 10 {
		t.Errorf("one-file codex reads its directory's settings: %+v %v", s, err)
	}
	write(t, dir, SettingsFile, "[limits]\nmax_depth = 10\n\nmax_detph = 3\n")
	if _, _, err := LoadSettings(dir, nil); err == nil || !strings.Contains(err.Error(), ":4: unknown key limits.max_detph") {
		t.Errorf("typo: %v", err)
	}
	write(t, dir, SettingsFile, "[limits]\nmax_chars = -5\n")
	if _, _, err := LoadSettings(dir, nil); err == nil || !strings.Contains(err.Error(), ":2: limits.max_chars = -5") {
		t.Errorf("negative: %v", err)
	}
	write(t, dir, SettingsFile, "[limits\n")
	if _, _, err := LoadSettings(dir, nil); err == nil {
		t.Error("bad syntax accepted")
	}
}
