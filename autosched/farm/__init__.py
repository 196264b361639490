"""Device farms on Dask distributed: workers that own one device each, and the runner
that sends a job's batches to them. autosched writes no scheduler, queue or RPC of its
own: Dask's scheduler places each batch on a worker that advertises the device kind as
a resource, one batch at a time per device, and moves it elsewhere when a worker dies.
"""
