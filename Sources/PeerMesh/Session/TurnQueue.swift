/// Items waiting their turn, served round-robin across the addresses they belong to and oldest first within one.
///
/// The addresses stand in the order their turns come: the first one's oldest item is served next, and the address
/// then goes to the back if it has more waiting; an address with nothing waiting that gets an item joins at the back.
/// So the items waiting for other addresses delay an item by one turn per address ahead of it, however many each of
/// those has waiting, and an address's own earlier items by one each. Pure; used where one thing a second is handed
/// out and a searcher from one address must not starve a real caller from another (the advertiser's shares of the
/// digits, the inviter's message 3s).
struct TurnQueue<Item: Hashable & Sendable>: Sendable {
    /// An address with items waiting, oldest first (never empty).
    private struct Address: Sendable {
        let key: [UInt8]
        var items: [Item]
    }

    private var addresses: [Address] = []

    /// Whether nothing waits.
    var isEmpty: Bool { addresses.isEmpty }

    /// How many items wait.
    var count: Int { addresses.reduce(0) { $0 + $1.items.count } }

    /// Whether `item` waits.
    func contains(_ item: Item) -> Bool { addresses.contains { $0.items.contains(item) } }

    /// Adds `item`, of `address`, behind that address's items (the address behind all others, if it had none).
    mutating func append(_ item: Item, address: [UInt8]) {
        precondition(!contains(item), "an item waits once")
        if let i = addresses.firstIndex(where: { $0.key == address }) {
            addresses[i].items.append(item)
        } else {
            addresses.append(Address(key: address, items: [item]))
        }
    }

    /// Takes `item` out of the queue, if it waits; its address keeps its place for the items it has left.
    mutating func remove(_ item: Item) {
        guard let i = addresses.firstIndex(where: { $0.items.contains(item) }) else { return }
        addresses[i].items.removeAll { $0 == item }
        if addresses[i].items.isEmpty { addresses.remove(at: i) }
    }

    /// Takes the item whose turn it is (nil: none waits).
    mutating func next() -> Item? {
        guard !addresses.isEmpty else { return nil }
        var served = addresses.removeFirst()
        let item = served.items.removeFirst()
        if !served.items.isEmpty { addresses.append(served) }
        return item
    }

    /// Forgets every item.
    mutating func removeAll() { addresses.removeAll() }
}
