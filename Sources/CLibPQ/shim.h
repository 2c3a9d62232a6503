#ifndef TANDEM_CLIBPQ_SHIM_H
#define TANDEM_CLIBPQ_SHIM_H

// libpq, PostgreSQL's own C client (Debian's libpq-dev), for the server's PostgreSQL store.
#include <libpq-fe.h>

#endif
