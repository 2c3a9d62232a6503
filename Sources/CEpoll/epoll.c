// The header is the whole target: SwiftPM needs a source file to build it.
#include "CEpoll.h"
