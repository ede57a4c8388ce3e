package logx

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Logger wraps log so that messages and string, byte string, error and stringer
// fields are scrubbed, also those added later with With.
func (s *Scrubber) Logger(log *zap.Logger) *zap.Logger {
	if len(s.secrets) == 0 {
		return log
	}
	return log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return &scrubCore{Core: c, s: s} }))
}

type scrubCore struct {
	zapcore.Core
	s *Scrubber
}

func (c *scrubCore) With(fields []zapcore.Field) zapcore.Core {
	return &scrubCore{Core: c.Core.With(c.fields(fields)), s: c.s}
}

func (c *scrubCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *scrubCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	e.Message = c.s.String(e.Message)
	return c.Core.Write(e, c.fields(fields))
}

// fields scrubs the field types a secret can travel in; pisync logs nothing else near
// a connection.
func (c *scrubCore) fields(fields []zapcore.Field) []zapcore.Field {
	out := make([]zapcore.Field, len(fields))
	for i, f := range fields {
		switch f.Type {
		case zapcore.StringType:
			f.String = c.s.String(f.String)
		case zapcore.ByteStringType:
			if b, ok := f.Interface.([]byte); ok {
				f = zap.String(f.Key, c.s.String(string(b)))
			}
		case zapcore.ErrorType:
			if err, ok := f.Interface.(error); ok && err != nil {
				f = zap.String(f.Key, c.s.String(err.Error()))
			}
		case zapcore.StringerType:
			if st, ok := f.Interface.(fmt.Stringer); ok && st != nil {
				f = zap.String(f.Key, c.s.String(st.String()))
			}
		}
		out[i] = f
	}
	return out
}
