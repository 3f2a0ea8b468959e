"""What the worker gate and the worker's services share, below both: the header a task
carries between deliveries (``state``), the one publisher (``publish``), a run's charges
and deciding them (``charges``, ``charges_decide``, ``judge``), the live overrides
(``overrides``, ``adaptive``, ``live``), settling (``settling``), fair share's queues
(``fair``), followers (``follow``), copies (``copies``) and a delivery's deadlines
(``delivery``)."""
