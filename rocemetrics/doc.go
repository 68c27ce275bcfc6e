// Package rocemetrics exports the counters of a roce.Device to Prometheus.
//
// Every counter of roce.Counters becomes a counter metric named
// roce_<name>_total (roce_sent_pkts_total, roce_retry_exceeded_err_total, …,
// the names of rxe's hw_counters), labelled with the device name, plus a few
// gauges describing the port. The core roce package does not depend on
// Prometheus; only this package does.
package rocemetrics
