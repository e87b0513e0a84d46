package main

import (
	"io"
	"log/slog"

	"github.com/sluicehq/sluice/config"
)

// newLogger returns the log cfg describes, writing to w: text (slog's key=value lines) or JSON
// (one object a line), at the least level in level, which it sets to cfg's (a reload sets it
// again; the format changes at a restart).
func newLogger(cfg config.Log, level *slog.LevelVar, w io.Writer) *slog.Logger {
	level.Set(cfg.Level)
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Format == config.LogJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
