"""The Redis stores beside the funnels, under the same key prefix: parked tasks, the
fair-share queues, concurrency leases, bookings given back, and what the funnels' Redis
is fit for (the start check, persistence). They build on the limiter core only."""
