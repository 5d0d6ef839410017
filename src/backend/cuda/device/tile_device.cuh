// Device helpers included by every generated kernel.
