package lease

// Keeping reports whether l is still held and not being released: only
// then is it re-acquired on masters that lost it.
func (w *Watchdog) Keeping(l *Lease) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return l.state == leaseHeld && !l.releasing
}
