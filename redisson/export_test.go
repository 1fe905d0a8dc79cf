package redisson_test

import "github.com/dlock-go/dlock/redisson/internal/javapeer"

var javapeerIMSE = javapeer.ErrIllegalMonitorState
