package redisson

// WaitersOf returns how many of c's blocked calls wait on channel.
func WaitersOf(c *Client, channel string) int { return c.waitersOf(channel) }
