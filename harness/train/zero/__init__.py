"""The DeepSpeed ZeRO engine in its parts: ``config`` (its JSON and optimizer), ``launch`` (the parent side: torchrun,
signals, the gathered weights), ``rank`` (one rank's loop), ``partition`` (ZeRO-3 partitions: the EMA's pieces and
the final gather), ``resume`` (save and resume), ``sequence``
(Ulysses sequence parallelism: the slice, the tiled loss, the refusals). ``harness.train.deepspeed_engine`` is its
front."""
