/// A first-in, first-out queue with amortized O(1) push and pop.
///
/// A plain array with a moving head: popping does not shift the elements; the consumed prefix
/// is dropped once it is more than half the storage.
struct FIFO<Element> {
    private var elements: [Element] = []
    private var head = 0

    var isEmpty: Bool { head == elements.count }
    var count: Int { elements.count - head }

    mutating func append(_ element: Element) {
        elements.append(element)
    }

    mutating func popFirst() -> Element? {
        guard head < elements.count else { return nil }
        let element = elements[head]
        head += 1
        if head == elements.count {
            elements.removeAll(keepingCapacity: elements.count <= 64)
            head = 0
        } else if head > 64 && head * 2 > elements.count {
            elements.removeFirst(head)
            head = 0
        }
        return element
    }

    mutating func removeAll() {
        elements = []
        head = 0
    }
}
